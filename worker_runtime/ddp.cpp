// DistributedDataParallel: construction (model check, broadcast from rank 0) and bucket
// assignment. The per-backward machinery is in ddp_reducer.cpp.
#include "worker_runtime/ddp.h"

#include <map>
#include <sstream>

#include "base/errors.h"
#include "base/timeline.h"
#include "worker_runtime/ddp_reducer.h"
#include "worker_runtime/model_description.h"

namespace ddprun::runtime {
namespace {

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// "parameter fc1.weight (Float [512, 784])" from a description line.
std::string pretty(const std::string& line) {
  std::vector<std::string> f;
  std::istringstream in(line);
  for (std::string x; std::getline(in, x, '|');) f.push_back(x);
  if (f.size() != 4) return line;
  return f[0] + " " + f[1] + " (" + f[2] + " " + f[3] + ")";
}

// Every rank must hold the same parameters and buffers (names, dtypes, shapes). Ranks compare
// hashes; when they differ, rank 0's list is broadcast and each differing rank names the first
// difference. All ranks throw, so none is left waiting in a collective.
void checkSameModel(const torch::nn::Module& module, Communicator& comm) {
  const std::string mine = join(describeModel(module));
  torch::Tensor sig = torch::tensor({textDigest(mine), static_cast<int64_t>(mine.size())}, torch::kInt64);
  const torch::Tensor all = comm.allgather(sig.to(comm.device())).to(torch::kCPU);
  std::vector<int> differing;
  for (int r = 1; r < comm.size(); ++r) {
    if (!torch::equal(all[r], all[0])) differing.push_back(r);
  }
  if (differing.empty()) return;
  const int64_t len0 = all[0][1].item<int64_t>();
  torch::Tensor bytes = torch::empty({len0}, torch::kUInt8);
  if (comm.rank() == 0) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  torch::Tensor onDevice = bytes.to(comm.device());
  comm.broadcast(onDevice, 0);
  bytes = onDevice.to(torch::kCPU);
  const std::string theirs(static_cast<const char*>(bytes.data_ptr()), len0);
  std::ostringstream msg;
  msg << "DistributedDataParallel: the model differs across ranks: ";
  if (theirs == mine) {
    msg << "rank(s)";
    for (int r : differing) msg << " " << r;
    msg << " hold a different model than rank 0 (see their error)";
  } else {
    const auto a = split(theirs), b = split(mine);
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    if (i < a.size() && i < b.size()) {
      msg << "rank 0 has " << pretty(a[i]) << " where rank " << comm.rank() << " has "
          << pretty(b[i]);
    } else {
      msg << "rank 0 has " << a.size() << " parameters and buffers, rank " << comm.rank()
          << " has " << b.size() << " (first extra: " << pretty(i < a.size() ? a[i] : b[i]) << ")";
    }
  }
  throw ConfigError(msg.str());
}

// Copies rank 0's tensors to every rank, one coalesced broadcast per dtype.
void broadcastFromRankZero(const std::vector<torch::Tensor>& tensors, Communicator& comm) {
  torch::NoGradGuard noGrad;
  std::map<c10::ScalarType, std::vector<torch::Tensor>> byType;
  for (const auto& t : tensors) {
    if (t.numel() > 0) byType[t.scalar_type()].push_back(t);
  }
  for (auto& [type, group] : byType) {
    std::vector<torch::Tensor> flat;
    for (const auto& t : group) flat.push_back(t.reshape(-1));
    torch::Tensor buffer = torch::cat(flat).to(comm.device());
    comm.broadcast(buffer, 0);
    int64_t offset = 0;
    for (auto& t : group) {
      t.copy_(buffer.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

}  // namespace

std::vector<BucketInfo> assignBuckets(const std::vector<size_t>& paramBytes,
                                      const std::vector<torch::Dtype>& dtypes,
                                      const DdpOptions& options) {
  DDPRUN_CHECK(paramBytes.size() == dtypes.size());
  std::vector<BucketInfo> closed;
  std::map<torch::Dtype, BucketInfo> open;
  std::map<torch::Dtype, int> closedPerType;
  for (size_t k = paramBytes.size(); k-- > 0;) {  // reverse registration order
    BucketInfo& b = open[dtypes[k]];
    b.dtype = dtypes[k];
    b.params.push_back(k);
    b.bytes += paramBytes[k];
    const size_t cap =
        closedPerType[dtypes[k]] == 0 ? options.firstBucketCapBytes : options.bucketCapBytes;
    if (b.bytes >= cap) {
      closed.push_back(std::move(b));
      open.erase(dtypes[k]);
      ++closedPerType[dtypes[k]];
    }
  }
  for (auto& [type, b] : open) closed.push_back(std::move(b));
  // Launch order: by the position of each bucket's first parameter in reverse registration order.
  std::stable_sort(closed.begin(), closed.end(), [](const BucketInfo& a, const BucketInfo& b) {
    return a.params.front() > b.params.front();
  });
  return closed;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<Communicator> comm,
                                                 DdpOptions options)
    : module_(std::move(module)), comm_(std::move(comm)) {
  if (!module_) throw ConfigError("DistributedDataParallel: the module is null");
  if (!comm_) throw ConfigError("DistributedDataParallel: the communicator is null");
  if (options.bucketCapBytes == 0 || options.firstBucketCapBytes == 0) {
    throw ConfigError("DistributedDataParallel: bucket caps must be > 0 bytes");
  }
  // On the timeline: a recovery builds DDP again on the new generation's communicator.
  ddprun::timeline::Scope span("ddp setup", "runtime");
  span.countMinorFaults();
  if (options.checkModel) checkSameModel(*module_, *comm_);
  std::vector<torch::Tensor> params = module_->parameters();
  std::vector<torch::Tensor> buffers = module_->buffers();
  std::vector<torch::Tensor> everything = params;
  everything.insert(everything.end(), buffers.begin(), buffers.end());
  if (options.initSync) broadcastFromRankZero(everything, *comm_);
  std::vector<torch::Tensor> trained;
  std::vector<size_t> trainedIndex;  // position in module->parameters()
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].requires_grad()) {
      trained.push_back(params[i]);
      trainedIndex.push_back(i);
    }
  }
  reducer_ = std::make_unique<Reducer>(std::move(trained), trainedIndex, std::move(buffers), comm_,
                                       options);
}

DistributedDataParallel::~DistributedDataParallel() = default;

const std::vector<BucketInfo>& DistributedDataParallel::buckets() const {
  return reducer_->buckets();
}

int64_t DistributedDataParallel::syncedBackwards() const { return reducer_->syncedBackwards(); }

bool DistributedDataParallel::sharedBuckets() const { return reducer_->sharedBuckets(); }

int64_t DistributedDataParallel::copiedBytes() const { return reducer_->copiedBytes(); }

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->setSync(false)) {}

DistributedDataParallel::NoSync::~NoSync() { ddp_.reducer_->setSync(previous_); }

}  // namespace ddprun::runtime
