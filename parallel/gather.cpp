#include "parallel/gather.h"

#include <algorithm>
#include <cstring>

namespace flowtrain::parallel {

at::Tensor gather_rows(Comm& group, const at::Tensor& mine) {
  // Comm::all_gather concatenates along dim 0 (the backends check the output is `mine` with dim 0
  // times the group's size), so gather [1, …] rows and read them back as [size, …].
  const at::Tensor in = mine.contiguous().unsqueeze(0);
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = group.size();
  at::Tensor all = at::empty(shape, in.options());
  group.all_gather(all, in)->wait();
  return all.cpu();
}

std::vector<std::vector<double>> gather_vector(Comm& group, const std::vector<double>& mine, const c10::Device& device) {
  const auto n = static_cast<int64_t>(mine.size());
  const at::Tensor all = gather_rows(group, at::tensor(mine, at::TensorOptions().dtype(at::kDouble)).to(device));
  std::vector<std::vector<double>> out;
  for (int64_t r = 0; r < group.size(); ++r) out.emplace_back(all.data_ptr<double>() + r * n, all.data_ptr<double>() + (r + 1) * n);
  return out;
}

std::vector<int64_t> gather_value(Comm& group, int64_t mine, const c10::Device& device) {
  const at::Tensor all = gather_rows(group, at::full({1}, mine, at::TensorOptions().dtype(at::kLong).device(device)));
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + group.size());
}

std::vector<std::string> gather_string(Comm& group, const std::string& mine, int64_t max_bytes,
                                       const c10::Device& device) {
  at::Tensor bytes = at::zeros({max_bytes}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), std::min<size_t>(mine.size(), static_cast<size_t>(max_bytes - 1)));
  const at::Tensor all = gather_rows(group, bytes.to(device));
  std::vector<std::string> out;
  for (int64_t r = 0; r < group.size(); ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * max_bytes));  // zero-terminated
  return out;
}

}  // namespace flowtrain::parallel
