// Collectives straight over MPI as TensorFlow ops: what DirectMPICommunicator
// (hvd_easgd/comm/mpi_direct.py) runs inside a step.
//
// Each op is one synchronous MPI call (or two, for a gather of rows whose
// number differs by rank) made on the thread TF runs the kernel on. There is
// no background thread and no negotiation: every rank traces the same code,
// and the ops are stateful, so TF's automatic control dependencies run them
// in program order and every rank issues the same collectives in the same
// order. What guards that assumption instead of trusting it:
//   * a collective that starts while another one on the same communicator is
//     running fails (taking turns could pick a different order on each rank);
//   * a running hash of every collective's kind, dtypes and sizes, read by
//     MpiDirectOrder, which tests compare across ranks;
//   * a watchdog that aborts the job when one collective has waited longer
//     than its stall limit (a rank died or took another path), instead of
//     hanging forever.
//
// The communicator is an MPI_Comm passed as its Fortran handle (an int attr):
// Python duplicates and splits communicators with mpi4py and hands the ops
// the handle, so a kernel needs no Python at run time.
// MPI's C API only: mpi.h would otherwise pull in the C++ bindings, whose
// library (libmpi_cxx) the link leaves out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/prctl.h>
#include <time.h>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace hvd_easgd {
namespace {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// Segments of a packed buffer start at this many bytes, so that every output
// taken as a slice of the buffer is as aligned as a tensor TF allocates itself
// (TF's Eigen kernels assume that alignment).
constexpr int64_t kAlignBytes = 64;

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// --- per-communicator state: the order guard, the order hash, the stall clock ---
struct CommState {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::atomic<bool> busy{false};
  std::atomic<double> stall_seconds{0.0};
  std::atomic<int64_t> waiting_since{0};  // steady-clock ns when the running collective began; 0: none
  std::mutex mu;                          // guards what the watchdog reads and the order hash
  std::string running;                    // the running collective, for the stall message
  uint64_t order_hash = 1469598103934665603ULL;  // FNV-1a 64 offset basis
  int64_t collectives = 0;
};

std::mutex registry_mu;
std::map<int, std::unique_ptr<CommState>>& Registry() {
  static auto* registry = new std::map<int, std::unique_ptr<CommState>>();
  return *registry;
}

int WorldRank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Checks every communicator's running collective every `period` seconds and
// aborts the whole job when one has waited past its communicator's limit.
void WatchForStalls() {
  for (;;) {
    double period = 5.0;
    {
      std::lock_guard<std::mutex> lock(registry_mu);
      for (auto& entry : Registry()) {
        double limit = entry.second->stall_seconds.load();
        if (limit > 0 && limit / 4 < period) period = limit / 4;
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(period));
    std::lock_guard<std::mutex> lock(registry_mu);
    for (auto& entry : Registry()) {
      CommState& s = *entry.second;
      double limit = s.stall_seconds.load();
      int64_t since = s.waiting_since.load();
      if (limit <= 0 || since == 0 || (NowNanos() - since) * 1e-9 <= limit) continue;
      std::string what;
      {
        std::lock_guard<std::mutex> state_lock(s.mu);
        what = s.running;
      }
      std::fprintf(stderr,
                   "hvd_easgd (rank %d): the collective %s has waited %g s for the other ranks (a rank "
                   "stopped or died); aborting the job\n",
                   WorldRank(), what.c_str(), limit);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
}

// The state of the communicator with this Fortran handle, made on first use.
// A stall limit < 0 leaves the communicator's limit as it is.
CommState* StateFor(int fortran_handle, double stall_seconds) {
  static std::once_flag watchdog_started;
  CommState* state;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto& slot = Registry()[fortran_handle];
    if (!slot) {
      slot.reset(new CommState());
      slot->comm = MPI_Comm_f2c(fortran_handle);
      MPI_Comm_rank(slot->comm, &slot->rank);
      MPI_Comm_size(slot->comm, &slot->size);
    }
    state = slot.get();
  }
  if (stall_seconds >= 0) state->stall_seconds.store(stall_seconds);
  if (stall_seconds > 0) std::call_once(watchdog_started, [] { std::thread(WatchForStalls).detach(); });
  return state;
}

// One collective on a communicator: refuses to overlap another, adds itself
// to the order hash and runs the stall clock while it waits.
class Collective {
 public:
  Collective(CommState* state, const std::string& what) : state_(state) {
    ok_ = !state_->busy.exchange(true);
    if (!ok_) return;
    std::lock_guard<std::mutex> lock(state_->mu);
    for (unsigned char c : what) {
      state_->order_hash ^= c;
      state_->order_hash *= 1099511628211ULL;  // FNV-1a 64 prime
    }
    state_->order_hash ^= '\n';
    state_->order_hash *= 1099511628211ULL;
    state_->collectives += 1;
    state_->running = what;
    state_->waiting_since.store(NowNanos());
  }
  ~Collective() {
    if (!ok_) return;
    state_->waiting_since.store(0);
    state_->busy.store(false);
  }
  bool ok() const { return ok_; }

 private:
  CommState* state_;
  bool ok_;
};

// --- waiting for the other ranks without holding a core ------------------------------
// A rank that reaches a collective first would otherwise wait inside the MPI
// call, polling: with as many ranks as cores (or another job on the node)
// that poll takes the core the late rank needs to finish its step, and a
// local-update strategy (EASGD, PeriodicAverage) lets the ranks drift apart
// by several steps between collectives. So every collective first meets the
// other ranks in a non-blocking barrier, tested in a loop that polls for a
// spin budget and then naps, in naps that double from kFirstNapNanos to
// kLongestNapNanos (the most a late partner's arrival can go unnoticed). The
// data then moves in MPI's own blocking collective, fastest once everyone is
// there. The budget is not shorter because waking from a nap is slow on a
// virtual machine (the idle vCPU is descheduled by the host): on this
// project's 2-vCPU test machine a 200 us budget cost SyncAverage a quarter of
// its throughput on a quiet machine, where the ranks arrive within a
// millisecond of each other.
//   HVD_EASGD_MPI_DIRECT_SPIN_US  the budget in microseconds (default 1000)
//   HVD_EASGD_MPI_DIRECT_WAIT=spin  no barrier: MPI's own wait, polling throughout
constexpr int64_t kDefaultSpinMicros = 1000;
constexpr int64_t kFirstNapNanos = 20 * 1000;
constexpr int64_t kLongestNapNanos = 200 * 1000;

bool SleepWhileWaiting() {
  static const bool sleep = [] {
    const char* mode = std::getenv("HVD_EASGD_MPI_DIRECT_WAIT");
    return mode == nullptr || std::string(mode) != "spin";
  }();
  return sleep;
}

int64_t SpinNanos() {
  static const int64_t nanos = [] {
    const char* micros = std::getenv("HVD_EASGD_MPI_DIRECT_SPIN_US");
    char* end = nullptr;
    const long long value = micros ? std::strtoll(micros, &end, 10) : -1;
    return (micros && end != micros && *end == '\0' && value >= 0 ? value : kDefaultSpinMicros) * 1000;
  }();
  return nanos;
}

void ArriveTogether(MPI_Comm comm) {
  if (!SleepWhileWaiting()) return;
  // Naps as long as asked, not the kernel's default 50 us of slack.
  thread_local bool slack_set = false;
  if (!slack_set) slack_set = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0;
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  int done = 0;
  const int64_t start = NowNanos();
  int64_t nap = kFirstNapNanos;
  for (;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (NowNanos() - start < SpinNanos()) continue;
    timespec pause{0, static_cast<long>(nap)};
    nanosleep(&pause, nullptr);
    nap = std::min(nap * 2, kLongestNapNanos);
  }
}

// --- datatypes and reductions --------------------------------------------------------
// 16-bit floats travel as 16-bit words and are added by user-defined
// reductions (MPI has no 16-bit floats): widened to float, added, rounded back
// to nearest even, as TF and NumPy add them.
template <typename Half>
void AddHalves(void* in, void* inout, int* len, MPI_Datatype*) {
  const Half* a = static_cast<const Half*>(in);
  Half* b = static_cast<Half*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Half(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

MPI_Op HalfSum(DataType dtype) {
  static MPI_Op half_sum = MPI_OP_NULL, bfloat16_sum = MPI_OP_NULL;
  static std::once_flag created;
  std::call_once(created, [] {
    MPI_Op_create(&AddHalves<Eigen::half>, /*commute=*/1, &half_sum);
    MPI_Op_create(&AddHalves<Eigen::bfloat16>, /*commute=*/1, &bfloat16_sum);
  });
  return dtype == tensorflow::DT_HALF ? half_sum : bfloat16_sum;
}

// The MPI datatype and sum reduction for a TF dtype; false if there is none.
bool MpiSum(DataType dtype, MPI_Datatype* type, MPI_Op* op) {
  *op = MPI_SUM;
  switch (dtype) {
    case tensorflow::DT_FLOAT: *type = MPI_FLOAT; return true;
    case tensorflow::DT_DOUBLE: *type = MPI_DOUBLE; return true;
    case tensorflow::DT_INT32: *type = MPI_INT32_T; return true;
    case tensorflow::DT_INT64: *type = MPI_INT64_T; return true;
    case tensorflow::DT_INT16: *type = MPI_INT16_T; return true;
    case tensorflow::DT_INT8: *type = MPI_INT8_T; return true;
    case tensorflow::DT_UINT8: *type = MPI_UINT8_T; return true;
    case tensorflow::DT_UINT16: *type = MPI_UINT16_T; return true;
    case tensorflow::DT_HALF:
    case tensorflow::DT_BFLOAT16: *type = MPI_UINT16_T; *op = HalfSum(dtype); return true;
    default: return false;
  }
}

// Sum to average in place: floats divided exactly, integers floored.
template <typename T>
void DivideFloat(void* data, int64_t n, int size) {
  T* x = static_cast<T*>(data);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / static_cast<T>(size);
}
template <typename Half>
void DivideHalf(void* data, int64_t n, int size) {
  Half* x = static_cast<Half*>(data);
  for (int64_t i = 0; i < n; ++i) x[i] = Half(static_cast<float>(x[i]) / static_cast<float>(size));
}
template <typename T>
void FloorDivide(void* data, int64_t n, int size) {
  T* x = static_cast<T*>(data);
  const T d = static_cast<T>(size);
  for (int64_t i = 0; i < n; ++i) {
    T q = x[i] / d;
    if ((x[i] % d != 0) && ((x[i] < 0) != (d < 0))) q -= 1;
    x[i] = q;
  }
}
template <typename T>
void UnsignedDivide(void* data, int64_t n, int size) {
  T* x = static_cast<T*>(data);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(x[i] / static_cast<T>(size));
}

void Average(DataType dtype, void* data, int64_t n, int size) {
  switch (dtype) {
    case tensorflow::DT_FLOAT: DivideFloat<float>(data, n, size); break;
    case tensorflow::DT_DOUBLE: DivideFloat<double>(data, n, size); break;
    case tensorflow::DT_HALF: DivideHalf<Eigen::half>(data, n, size); break;
    case tensorflow::DT_BFLOAT16: DivideHalf<Eigen::bfloat16>(data, n, size); break;
    case tensorflow::DT_INT32: FloorDivide<int32_t>(data, n, size); break;
    case tensorflow::DT_INT64: FloorDivide<int64_t>(data, n, size); break;
    case tensorflow::DT_INT16: FloorDivide<int16_t>(data, n, size); break;
    case tensorflow::DT_INT8: FloorDivide<int8_t>(data, n, size); break;
    case tensorflow::DT_UINT8: UnsignedDivide<uint8_t>(data, n, size); break;
    case tensorflow::DT_UINT16: UnsignedDivide<uint16_t>(data, n, size); break;
    default: break;
  }
}

// The kernels' shared attrs: which communicator, and how long to wait.
// The inputs of a grouped collective by dtype, dtypes in order of first
// appearance (the same on every rank), and the collective's description for
// the stall guard and the order digest: "<kind> <dtype>x<elements> ...".
struct DtypeGroups {
  std::vector<DataType> dtypes;
  std::vector<std::vector<int>> inputs;  // input indices, per dtype
};

DtypeGroups GroupByDtype(OpKernelContext* ctx) {
  DtypeGroups found;
  for (int i = 0; i < ctx->num_inputs(); ++i) {
    DataType dtype = ctx->input_dtype(i);
    size_t g = 0;
    while (g < found.dtypes.size() && found.dtypes[g] != dtype) ++g;
    if (g == found.dtypes.size()) {
      found.dtypes.push_back(dtype);
      found.inputs.emplace_back();
    }
    found.inputs[g].push_back(i);
  }
  return found;
}

std::string Describe(OpKernelContext* ctx, std::string what, const DtypeGroups& found) {
  for (size_t g = 0; g < found.inputs.size(); ++g) {
    int64_t n = 0;
    for (int i : found.inputs[g]) n += ctx->input(i).NumElements();
    what += " " + tensorflow::DataTypeString(found.dtypes[g]) + "x" + std::to_string(n);
  }
  return what;
}

class MpiKernel : public OpKernel {
 public:
  explicit MpiKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int handle;
    float stall_seconds;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("comm", &handle));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stall_seconds", &stall_seconds));
    state_ = StateFor(handle, stall_seconds);
  }

 protected:
  // Starts the collective `what`: fails the op if another one is running,
  // else returns once every rank of the communicator has reached it.
  bool Begin(OpKernelContext* ctx, const std::string& what, std::unique_ptr<Collective>* collective) {
    collective->reset(new Collective(state_, what));
    if (!(*collective)->ok()) {
      ctx->SetStatus(absl::FailedPreconditionError(
          what + " started while another collective of the mpi-direct communicator was running; collectives "
                 "must run one at a time, in program order, for every rank to issue them alike"));
      return false;
    }
    ArriveTogether(state_->comm);
    return true;
  }
  CommState* state_ = nullptr;
};

// A packed buffer: the segments of one or more tensors, each starting
// kAlignBytes-aligned, and the slices of it that become outputs.
struct Packing {
  std::vector<int> members;         // input indices
  std::vector<int64_t> offsets;     // in elements
  int64_t total = 0;                // elements, padding included
};

Packing Pack(OpKernelContext* ctx, const std::vector<int>& members, int64_t element_bytes) {
  Packing p;
  p.members = members;
  const int64_t align = std::max<int64_t>(1, kAlignBytes / element_bytes);
  for (int i : members) {
    p.offsets.push_back(p.total);
    p.total += RoundUp(ctx->input(i).NumElements(), align);
  }
  return p;
}

// Outputs `p.members` as aligned slices of the flat `buffer`, shaped as the inputs.
void SliceOutputs(OpKernelContext* ctx, const Packing& p, const Tensor& buffer) {
  for (size_t k = 0; k < p.members.size(); ++k) {
    const Tensor& in = ctx->input(p.members[k]);
    Tensor slice = buffer.Slice(p.offsets[k], p.offsets[k] + in.NumElements());
    Tensor out;
    OP_REQUIRES(ctx, out.CopyFrom(slice, in.shape()), absl::InternalError("reshaping a packed slice failed"));
    ctx->set_output(p.members[k], out);
  }
}

// --- the ops -------------------------------------------------------------------------
class AllreduceOp : public MpiKernel {
 public:
  explicit AllreduceOp(OpKernelConstruction* ctx) : MpiKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("average", &average_));
  }

  void Compute(OpKernelContext* ctx) override {
    // One buffer per dtype, dtypes in order of first appearance: the same on every rank.
    const DtypeGroups found = GroupByDtype(ctx);
    const std::vector<DataType>& dtypes = found.dtypes;
    const std::vector<std::vector<int>>& groups = found.inputs;
    const std::string what = Describe(ctx, average_ ? "allreduce average" : "allreduce sum", found);
    std::unique_ptr<Collective> collective;
    if (!Begin(ctx, what, &collective)) return;
    for (size_t g = 0; g < groups.size(); ++g) {
      MPI_Datatype type;
      MPI_Op op;
      OP_REQUIRES(ctx, MpiSum(dtypes[g], &type, &op),
                  absl::InvalidArgumentError("the mpi-direct communicator cannot reduce " +
                                             tensorflow::DataTypeString(dtypes[g]) + " tensors"));
      const int64_t element_bytes = tensorflow::DataTypeSize(dtypes[g]);
      if (groups[g].size() == 1) {  // alone in its dtype: reduced straight into its output, no copy
        const int i = groups[g][0];
        const Tensor& in = ctx->input(i);
        Tensor* out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(i, in.shape(), &out));
        const int64_t n = in.NumElements();
        OP_REQUIRES(ctx, n <= INT32_MAX, absl::InvalidArgumentError("tensor too large for one MPI call"));
        MPI_Allreduce(in.tensor_data().data(), const_cast<char*>(out->tensor_data().data()), static_cast<int>(n),
                      type, op, state_->comm);
        if (average_) Average(dtypes[g], const_cast<char*>(out->tensor_data().data()), n, state_->size);
        continue;
      }
      Packing p = Pack(ctx, groups[g], element_bytes);
      OP_REQUIRES(ctx, p.total <= INT32_MAX, absl::InvalidArgumentError("tensors too large for one MPI call"));
      Tensor buffer;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(dtypes[g], TensorShape({p.total}), &buffer));
      char* data = const_cast<char*>(buffer.tensor_data().data());
      for (size_t k = 0; k < p.members.size(); ++k) {
        auto bytes = ctx->input(p.members[k]).tensor_data();
        char* segment = data + p.offsets[k] * element_bytes;
        std::memcpy(segment, bytes.data(), bytes.size());
        const int64_t end = k + 1 < p.members.size() ? p.offsets[k + 1] : p.total;
        std::memset(segment + bytes.size(), 0, (end - p.offsets[k]) * element_bytes - bytes.size());  // padding: zeros
      }
      MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(p.total), type, op, state_->comm);
      if (average_) Average(dtypes[g], data, p.total, state_->size);
      SliceOutputs(ctx, p, buffer);
    }
  }

 private:
  bool average_ = false;
};

class BroadcastOp : public MpiKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* ctx) : MpiKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("root_rank", &root_rank_));
    OP_REQUIRES(ctx, state_ != nullptr, absl::InternalError("no communicator"));
    OP_REQUIRES(ctx, root_rank_ >= 0 && root_rank_ < state_->size,
                absl::InvalidArgumentError("`root_rank` must be in [0, " + std::to_string(state_->size) +
                                           "). Received: root_rank=" + std::to_string(root_rank_)));
  }

  void Compute(OpKernelContext* ctx) override {
    // Every tensor in one byte buffer: one MPI_Bcast for the whole group.
    std::string what = "broadcast " + std::to_string(root_rank_);
    std::vector<int> members;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      members.push_back(i);
      what += " " + tensorflow::DataTypeString(ctx->input_dtype(i)) + "x" +
              std::to_string(ctx->input(i).NumElements());
    }
    std::unique_ptr<Collective> collective;
    if (!Begin(ctx, what, &collective)) return;
    // Offsets in bytes: every segment kAlignBytes-aligned.
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (int i : members) {
      offsets.push_back(total);
      total += RoundUp(ctx->input(i).TotalBytes(), kAlignBytes);
    }
    OP_REQUIRES(ctx, total <= INT32_MAX, absl::InvalidArgumentError("tensors too large for one MPI call"));
    Tensor buffer;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_UINT8, TensorShape({total}), &buffer));
    char* data = const_cast<char*>(buffer.tensor_data().data());
    const bool root = state_->rank == root_rank_;
    if (root) {
      for (int i : members) {
        auto bytes = ctx->input(i).tensor_data();
        std::memcpy(data + offsets[i], bytes.data(), bytes.size());
      }
    }
    MPI_Bcast(data, static_cast<int>(total), MPI_BYTE, root_rank_, state_->comm);
    for (int i : members) {
      if (root) {
        ctx->set_output(i, ctx->input(i));
        continue;
      }
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &out));
      std::memcpy(const_cast<char*>(out->tensor_data().data()), data + offsets[i], out->TotalBytes());
    }
  }

 private:
  int root_rank_ = 0;
};

class AllgatherOp : public MpiKernel {
 public:
  using MpiKernel::MpiKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& in = ctx->input(0);
    OP_REQUIRES(ctx, in.dims() >= 1, absl::InvalidArgumentError("allgather needs a tensor of rank >= 1"));
    TensorShape row_shape = in.shape();
    row_shape.RemoveDim(0);
    std::string what = "allgather " + tensorflow::DataTypeString(in.dtype()) + " " + row_shape.DebugString();
    std::unique_ptr<Collective> collective;
    if (!Begin(ctx, what, &collective)) return;
    // The number of rows may differ by rank: gather it first, then the bytes.
    const int size = state_->size;
    std::vector<int64_t> rows(size);
    int64_t mine = in.dim_size(0);
    MPI_Allgather(&mine, 1, MPI_INT64_T, rows.data(), 1, MPI_INT64_T, state_->comm);
    const int64_t row_bytes = row_shape.num_elements() * tensorflow::DataTypeSize(in.dtype());
    std::vector<int> counts(size), displacements(size);
    int64_t total_rows = 0, offset = 0;
    for (int r = 0; r < size; ++r) {
      OP_REQUIRES(ctx, offset + rows[r] * row_bytes <= INT32_MAX,
                  absl::InvalidArgumentError("allgather too large for one MPI call"));
      counts[r] = static_cast<int>(rows[r] * row_bytes);
      displacements[r] = static_cast<int>(offset);
      offset += rows[r] * row_bytes;
      total_rows += rows[r];
    }
    TensorShape out_shape = row_shape;
    out_shape.InsertDim(0, total_rows);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    MPI_Allgatherv(in.tensor_data().data(), counts[state_->rank], MPI_BYTE,
                   const_cast<char*>(out->tensor_data().data()), counts.data(), displacements.data(), MPI_BYTE,
                   state_->comm);
  }
};

// --- alltoall (the quantised allreduce's reduce-scatter phase) -----------------------
// Rank j receives part j of every rank's tensor: axis 0 is cut into `size`
// equal parts, which MPI_Alltoall exchanges as bytes; the output holds the
// parts received, in rank order. Same stall guard and order digest as every
// collective here (Begin).
class AlltoallOp : public MpiKernel {
 public:
  using MpiKernel::MpiKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& in = ctx->input(0);
    const int size = state_->size;
    OP_REQUIRES(ctx, in.dims() >= 1 && in.dim_size(0) % size == 0,
                absl::InvalidArgumentError("alltoall needs axis 0 divisible by the number of ranks"));
    std::string what = "alltoall " + tensorflow::DataTypeString(in.dtype()) + " " + in.shape().DebugString();
    std::unique_ptr<Collective> collective;
    if (!Begin(ctx, what, &collective)) return;
    const int64_t part_bytes = static_cast<int64_t>(in.tensor_data().size()) / size;
    OP_REQUIRES(ctx, part_bytes <= INT32_MAX, absl::InvalidArgumentError("alltoall too large for one MPI call"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.shape(), &out));
    MPI_Alltoall(in.tensor_data().data(), static_cast<int>(part_bytes), MPI_BYTE,
                 const_cast<char*>(out->tensor_data().data()), static_cast<int>(part_bytes), MPI_BYTE, state_->comm);
  }
};
// --- end of alltoall ---------------------------------------------------------------------
// --- reduce-scatter (Hierarchical's intra level) ---------------------------------------
// Every input is a flat tensor of size·m_t elements (the Python side flattens
// and zero-pads: comm/communicator.py's shard layout); rank r receives the
// reduction of elements [r·m_t, (r+1)·m_t) of each. The tensors of one dtype
// share one MPI_Reduce_scatter_block: the buffer holds, rank block by rank
// block, every tensor's r-th slice, so each rank's receive block is
// contiguous.
class ReducescatterOp : public MpiKernel {
 public:
  explicit ReducescatterOp(OpKernelConstruction* ctx) : MpiKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("average", &average_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int size = state_->size;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& in = ctx->input(i);
      OP_REQUIRES(ctx, in.dims() == 1 && in.NumElements() % size == 0,
                  absl::InvalidArgumentError("reducescatter needs flat tensors whose size is a multiple of the "
                                             "communicator's size " + std::to_string(size)));
    }
    const DtypeGroups found = GroupByDtype(ctx);
    const std::vector<DataType>& dtypes = found.dtypes;
    const std::vector<std::vector<int>>& groups = found.inputs;
    const std::string what = Describe(ctx, average_ ? "reducescatter average" : "reducescatter sum", found);
    std::unique_ptr<Collective> collective;
    if (!Begin(ctx, what, &collective)) return;
    for (size_t g = 0; g < groups.size(); ++g) {
      MPI_Datatype type;
      MPI_Op op;
      OP_REQUIRES(ctx, MpiSum(dtypes[g], &type, &op),
                  absl::InvalidArgumentError("the mpi-direct communicator cannot reduce " +
                                             tensorflow::DataTypeString(dtypes[g]) + " tensors"));
      const int64_t element_bytes = tensorflow::DataTypeSize(dtypes[g]);
      int64_t block = 0;  // elements each rank receives
      for (int i : groups[g]) block += ctx->input(i).NumElements() / size;
      OP_REQUIRES(ctx, block * size <= INT32_MAX, absl::InvalidArgumentError("tensors too large for one MPI call"));
      Tensor send, received;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(dtypes[g], TensorShape({block * size}), &send));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(dtypes[g], TensorShape({block}), &received));
      char* data = const_cast<char*>(send.tensor_data().data());
      for (int r = 0; r < size; ++r) {
        for (int i : groups[g]) {
          const int64_t slice_bytes = ctx->input(i).NumElements() / size * element_bytes;
          std::memcpy(data, ctx->input(i).tensor_data().data() + r * slice_bytes, slice_bytes);
          data += slice_bytes;
        }
      }
      char* mine = const_cast<char*>(received.tensor_data().data());
      MPI_Reduce_scatter_block(send.tensor_data().data(), mine, static_cast<int>(block), type, op, state_->comm);
      if (average_) Average(dtypes[g], mine, block, size);
      int64_t offset = 0;
      for (int i : groups[g]) {
        const int64_t m = ctx->input(i).NumElements() / size;
        Tensor* out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({m}), &out));
        std::memcpy(const_cast<char*>(out->tensor_data().data()), mine + offset * element_bytes, m * element_bytes);
        offset += m;
      }
    }
  }

 private:
  bool average_ = false;
};

class OrderOp : public OpKernel {
 public:
  explicit OrderOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int handle;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("comm", &handle));
    state_ = StateFor(handle, -1.0);
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({2}), &out));
    std::lock_guard<std::mutex> lock(state_->mu);
    out->flat<int64_t>()(0) = state_->collectives;
    out->flat<int64_t>()(1) = static_cast<int64_t>(state_->order_hash);
  }

 private:
  CommState* state_ = nullptr;
};

}  // namespace

#define HVD_EASGD_MPI_TYPES "{float, double, half, bfloat16, int32, int64, int16, int8, uint8, uint16}"

REGISTER_OP("MpiDirectAllreduce")
    .Input("tensors: T")
    .Output("reduced: T")
    .Attr("T: list(" HVD_EASGD_MPI_TYPES ") >= 1")
    .Attr("comm: int")
    .Attr("average: bool = false")
    .Attr("stall_seconds: float = 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    });

REGISTER_OP("MpiDirectBroadcast")
    .Input("tensors: T")
    .Output("broadcast: T")
    .Attr("T: list(" HVD_EASGD_MPI_TYPES ") >= 1")
    .Attr("comm: int")
    .Attr("root_rank: int")
    .Attr("stall_seconds: float = 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    });

REGISTER_OP("MpiDirectAllgather")
    .Input("tensor: T")
    .Output("gathered: T")
    .Attr("T: {float, double, half, bfloat16, int32, int64, int16, int8, uint8, uint16, bool}")
    .Attr("comm: int")
    .Attr("stall_seconds: float = 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle in, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &in));
      TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

// The alltoall's registration, in a block of its own.
REGISTER_OP("MpiDirectAlltoall")
    .Input("tensor: T")
    .Output("received: T")
    .Attr("T: {float, double, half, bfloat16, int32, int64, int16, int8, uint8, uint16, bool}")
    .Attr("comm: int")
    .Attr("stall_seconds: float = 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });
REGISTER_KERNEL_BUILDER(Name("MpiDirectAlltoall").Device(tensorflow::DEVICE_CPU), AlltoallOp);
REGISTER_OP("MpiDirectReducescatter")
    .Input("tensors: T")
    .Output("shards: T")
    .Attr("T: list(" HVD_EASGD_MPI_TYPES ") >= 1")
    .Attr("comm: int")
    .Attr("average: bool = false")
    .Attr("stall_seconds: float = 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      // A shard of each flat input: size / (the communicator's size), known only at run time.
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("MpiDirectOrder")
    .Output("count_and_hash: int64")
    .Attr("comm: int")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(2));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("MpiDirectAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("MpiDirectBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("MpiDirectAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("MpiDirectReducescatter").Device(tensorflow::DEVICE_CPU), ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("MpiDirectOrder").Device(tensorflow::DEVICE_CPU), OrderOp);

}  // namespace hvd_easgd
