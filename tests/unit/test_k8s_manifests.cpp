// The Kubernetes manifests in configs/k8s: every file parses, and the pieces that must agree do
// (the Job's pods resolve rank 0 through the headless Service, the environment the runtime and
// entrypoint.sh read is there and consistent with the GPU count, /dev/shm is big, the ConfigMap
// is the one mounted and its training config loads and fits the world size).
#include "trainer/config/config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(FLOWTRAIN_SOURCE_DIR) / "configs" / "k8s";

struct Doc {
  std::string file;
  YAML::Node node;
};

// Every document of every configs/k8s/*.yaml (multi-document files included).
std::vector<Doc> all_docs() {
  std::vector<Doc> docs;
  for (const auto& entry : fs::directory_iterator(kDir)) {
    if (entry.path().extension() != ".yaml") continue;
    for (const YAML::Node& node : YAML::LoadAllFromFile(entry.path().string()))
      if (node && !node.IsNull()) docs.push_back({entry.path().filename().string(), node});
  }
  return docs;
}

// The one document of `kind` in `file`; fails the test if there is not exactly one.
YAML::Node the(const std::string& kind, const std::string& file) {
  std::vector<YAML::Node> found;
  for (const Doc& d : all_docs())
    if (d.file == file && d.node["kind"] && d.node["kind"].as<std::string>() == kind) found.push_back(d.node);
  EXPECT_EQ(found.size(), 1u) << kind << " documents in " << file;
  return found.empty() ? YAML::Node() : found[0];
}

std::string name_of(const YAML::Node& n) { return n["metadata"]["name"].as<std::string>(); }

// The entry of a list of {name: …} maps (env, volumes, volumeMounts, containers) named `name`.
std::optional<YAML::Node> named(const YAML::Node& list, const std::string& name) {
  if (!list || !list.IsSequence()) return std::nullopt;
  for (const YAML::Node& item : list)
    if (item["name"] && item["name"].as<std::string>() == name) return item;
  return std::nullopt;
}

std::string env_value(const YAML::Node& container, const std::string& name) {
  auto e = named(container["env"], name);
  if (!e) {
    ADD_FAILURE() << "container " << container["name"] << " has no env " << name;
    return "";
  }
  EXPECT_TRUE((*e)["value"]) << name << " must be a literal value";
  return (*e)["value"] ? (*e)["value"].as<std::string>() : "";
}

// What every training pod needs, in either job kind: GPUs, a memory-backed /dev/shm, the
// ConfigMap mounted where FLOWTRAIN_CONFIG and the command expect it, the shared volume, env
// consistent with the GPU count. `c` is the training container of `pod_spec`.
void check_training_pod(const YAML::Node& pod_spec, const YAML::Node& c, int64_t nnodes) {
  const YAML::Node configmap = the("ConfigMap", "configmap.yaml");
  const YAML::Node pvc = the("PersistentVolumeClaim", "configmap.yaml");

  // GPUs: one rank per GPU, so NPROC_PER_NODE must equal the GPU limit.
  ASSERT_TRUE(c["resources"]["limits"]["nvidia.com/gpu"]) << "no nvidia.com/gpu limit";
  const int64_t gpus = c["resources"]["limits"]["nvidia.com/gpu"].as<int64_t>();
  EXPECT_GE(gpus, 1);
  EXPECT_EQ(std::stoll(env_value(c, "NPROC_PER_NODE")), gpus) << "one rank per GPU";
  EXPECT_EQ(std::stoll(env_value(c, "NNODES")), nnodes);
  EXPECT_EQ(env_value(c, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3");
  EXPECT_FALSE(named(c["env"], "JOB_COMPLETION_INDEX")) << "Kubernetes sets it; a fixed value gives every pod one rank";
  EXPECT_FALSE(named(c["env"], "RANK")) << "a fixed RANK gives every pod one rank";

  // /dev/shm: a memory-backed emptyDir (the container default is 64 MiB).
  std::optional<YAML::Node> shm_mount;
  for (const YAML::Node& m : c["volumeMounts"])
    if (m["mountPath"].as<std::string>() == "/dev/shm") shm_mount = m;
  ASSERT_TRUE(shm_mount) << "/dev/shm is not mounted";
  auto shm = named(pod_spec["volumes"], (*shm_mount)["name"].as<std::string>());
  ASSERT_TRUE(shm);
  EXPECT_EQ((*shm)["emptyDir"]["medium"].as<std::string>(""), "Memory");

  // The ConfigMap: mounted (by the ConfigMap's own name) at the directory of FLOWTRAIN_CONFIG,
  // and the command runs the entrypoint from there.
  const std::string config_path = env_value(c, "FLOWTRAIN_CONFIG");
  const std::string config_dir = fs::path(config_path).parent_path().string();
  std::optional<YAML::Node> config_volume;
  for (const YAML::Node& v : pod_spec["volumes"])
    if (v["configMap"]) config_volume = v;
  ASSERT_TRUE(config_volume) << "no configMap volume";
  EXPECT_EQ((*config_volume)["configMap"]["name"].as<std::string>(), name_of(configmap));
  auto config_mount = named(c["volumeMounts"], (*config_volume)["name"].as<std::string>());
  ASSERT_TRUE(config_mount) << "the configMap volume is not mounted";
  EXPECT_EQ((*config_mount)["mountPath"].as<std::string>(), config_dir);
  EXPECT_TRUE(configmap["data"][fs::path(config_path).filename().string()]) << config_path << " is not in the ConfigMap";
  const auto command = c["command"].as<std::vector<std::string>>();
  ASSERT_EQ(command.size(), 2u);
  EXPECT_EQ(command[0], "sh");
  EXPECT_EQ(fs::path(command[1]).parent_path().string(), config_dir);
  EXPECT_TRUE(configmap["data"][fs::path(command[1]).filename().string()]) << command[1] << " is not in the ConfigMap";

  // The shared volume (data set, checkpoints): the claim configmap.yaml defines, ReadWriteMany.
  std::optional<YAML::Node> shared_volume;
  for (const YAML::Node& v : pod_spec["volumes"])
    if (v["persistentVolumeClaim"]) shared_volume = v;
  ASSERT_TRUE(shared_volume) << "no persistentVolumeClaim volume";
  EXPECT_EQ((*shared_volume)["persistentVolumeClaim"]["claimName"].as<std::string>(), name_of(pvc));
  EXPECT_EQ(pvc["spec"]["accessModes"][0].as<std::string>(), "ReadWriteMany");
  auto shared_mount = named(c["volumeMounts"], (*shared_volume)["name"].as<std::string>());
  ASSERT_TRUE(shared_mount);

  // The run directory and the data set live on the shared volume.
  const auto cfg = flowtrain::trainer::parse_config(configmap["data"]["config.yaml"].as<std::string>(), "configmap");
  const std::string shared = (*shared_mount)["mountPath"].as<std::string>() + "/";
  EXPECT_EQ(cfg.run.out_dir.rfind(shared, 0), 0u) << "run.out_dir " << cfg.run.out_dir << " is not under " << shared;
  EXPECT_EQ(cfg.data.path.rfind(shared, 0), 0u) << "data.path " << cfg.data.path << " is not under " << shared;
  EXPECT_GE(pod_spec["terminationGracePeriodSeconds"].as<int64_t>(0), 60) << "too short to write a checkpoint";
}

}  // namespace

TEST(K8sManifests, EveryDocumentParsesAndIsNamed) {
  const auto docs = all_docs();
  std::map<std::string, int> kinds;
  for (const Doc& d : docs) {
    ASSERT_TRUE(d.node.IsMap()) << d.file;
    EXPECT_TRUE(d.node["apiVersion"]) << d.file;
    ASSERT_TRUE(d.node["kind"]) << d.file;
    EXPECT_FALSE(name_of(d.node).empty()) << d.file;
    ++kinds[d.node["kind"].as<std::string>()];
  }
  for (const char* kind : {"Service", "ConfigMap", "PersistentVolumeClaim", "Job", "PyTorchJob"})
    EXPECT_EQ(kinds[kind], 1) << kind;
}

TEST(K8sManifests, HeadlessServiceSelectsTheIndexedJobsPods) {
  const YAML::Node svc = the("Service", "headless-service.yaml");
  const YAML::Node job = the("Job", "indexed-job.yaml");
  EXPECT_EQ(svc["spec"]["clusterIP"].as<std::string>(), "None") << "must be headless (per-pod DNS records)";
  EXPECT_TRUE(svc["spec"]["publishNotReadyAddresses"].as<bool>(false));
  const YAML::Node pod = job["spec"]["template"];
  EXPECT_EQ(pod["spec"]["subdomain"].as<std::string>(), name_of(svc)) << "pods are <job>-<i>.<subdomain>";
  ASSERT_TRUE(svc["spec"]["selector"].IsMap());
  EXPECT_GT(svc["spec"]["selector"].size(), 0u);
  for (const auto& kv : svc["spec"]["selector"]) {
    const std::string key = kv.first.as<std::string>();
    ASSERT_TRUE(pod["metadata"]["labels"][key]) << "pod template lacks the selector's label " << key;
    EXPECT_EQ(pod["metadata"]["labels"][key].as<std::string>(), kv.second.as<std::string>()) << key;
  }
}

TEST(K8sManifests, IndexedJobIsAGangWithTheEnvironmentTheRuntimeNeeds) {
  const YAML::Node svc = the("Service", "headless-service.yaml");
  const YAML::Node job = the("Job", "indexed-job.yaml");
  const YAML::Node spec = job["spec"];
  EXPECT_EQ(spec["completionMode"].as<std::string>(), "Indexed") << "JOB_COMPLETION_INDEX is the node rank";
  const int64_t nodes = spec["completions"].as<int64_t>();
  EXPECT_GE(nodes, 1);
  EXPECT_EQ(spec["parallelism"].as<int64_t>(), nodes) << "all ranks must run at once";
  EXPECT_TRUE(spec["backoffLimit"]);
  const YAML::Node pod = spec["template"]["spec"];
  const std::string restart = pod["restartPolicy"].as<std::string>();
  EXPECT_TRUE(restart == "Never" || restart == "OnFailure") << restart;
  if (spec["podFailurePolicy"]) {
    EXPECT_EQ(restart, "Never") << "podFailurePolicy requires restartPolicy: Never";
  }

  auto container = named(pod["containers"], "trainer");
  ASSERT_TRUE(container) << "no container named trainer (podFailurePolicy names it)";
  const YAML::Node c = *container;
  check_training_pod(pod, c, nodes);
  EXPECT_EQ(env_value(c, "MASTER_ADDR"), name_of(job) + "-0." + name_of(svc)) << "rank 0 runs in pod 0";
  const std::string port = env_value(c, "MASTER_PORT");
  EXPECT_EQ(std::stoll(env_value(c, "WORLD_SIZE")), nodes * std::stoll(env_value(c, "NPROC_PER_NODE")));
  bool port_published = false;
  for (const YAML::Node& p : svc["spec"]["ports"]) port_published |= p["port"].as<std::string>() == port;
  EXPECT_TRUE(port_published) << "MASTER_PORT " << port << " is not a port of the Service";
}

TEST(K8sManifests, PyTorchJobHasMasterAndWorkersLikeTheIndexedJob) {
  const YAML::Node pj = the("PyTorchJob", "pytorchjob.yaml");
  const YAML::Node replicas = pj["spec"]["pytorchReplicaSpecs"];
  ASSERT_TRUE(replicas["Master"]);
  ASSERT_TRUE(replicas["Worker"]);
  EXPECT_EQ(replicas["Master"]["replicas"].as<int64_t>(), 1);
  const int64_t nodes = 1 + replicas["Worker"]["replicas"].as<int64_t>();
  for (const char* role : {"Master", "Worker"}) {
    SCOPED_TRACE(role);
    const YAML::Node r = replicas[role];
    EXPECT_TRUE(r["restartPolicy"]);
    // Kubeflow sets MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK in the container named `pytorch`,
    // MASTER_PORT from its port named pytorchjob-port.
    auto container = named(r["template"]["spec"]["containers"], "pytorch");
    ASSERT_TRUE(container) << "no container named pytorch";
    const YAML::Node c = *container;
    check_training_pod(r["template"]["spec"], c, nodes);
    EXPECT_TRUE(named(c["ports"], "pytorchjob-port"));
    for (const char* set_by_kubeflow : {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"})
      EXPECT_FALSE(named(c["env"], set_by_kubeflow)) << set_by_kubeflow << " is Kubeflow's to set";
  }
}

TEST(K8sManifests, ConfigMapTrainingConfigLoadsAndFitsTheWorld) {
  const YAML::Node configmap = the("ConfigMap", "configmap.yaml");
  const YAML::Node job = the("Job", "indexed-job.yaml");
  ASSERT_TRUE(configmap["data"]["config.yaml"]);
  const std::string text = configmap["data"]["config.yaml"].as<std::string>();
  flowtrain::trainer::Config cfg;
  ASSERT_NO_THROW(cfg = flowtrain::trainer::parse_config(text, "configmap")) << text;
  EXPECT_EQ(cfg.run.device, flowtrain::trainer::DeviceChoice::cuda);
  EXPECT_EQ(cfg.checkpoint.resume, "auto") << "restarted pods must continue from the newest checkpoint";
  EXPECT_GT(cfg.checkpoint.every, 0) << "an eviction would lose the whole run so far";

  auto c = named(job["spec"]["template"]["spec"]["containers"], "trainer");
  ASSERT_TRUE(c);
  const int64_t world = std::stoll(env_value(*c, "WORLD_SIZE"));
  const int64_t replicate = cfg.parallel.dp_replicate;
  const int64_t shard = cfg.parallel.dp_shard == -1 ? world / replicate : cfg.parallel.dp_shard;
  EXPECT_EQ(replicate * shard * cfg.parallel.cp, world) << "parallel sizes must multiply to WORLD_SIZE";
  EXPECT_EQ(cfg.data.batch_size % (replicate * shard * cfg.train.grad_accum), 0)
      << "the global batch must split evenly over the data-parallel ranks";
  EXPECT_TRUE(configmap["data"]["entrypoint.sh"]);
}
