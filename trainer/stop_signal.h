// Graceful stop on SIGTERM / SIGUSR1 / SIGINT (Slurm preemption, Kubernetes eviction, Ctrl-C):
// the handler only records the signal; the train loop checks it between steps, writes a
// checkpoint and exits 0, so the job can be requeued and resumed.
#pragma once

namespace flowtrain::trainer {

void install_stop_signal_handlers();
int stop_signal();  // 0 if none received yet, else the signal number

}  // namespace flowtrain::trainer
