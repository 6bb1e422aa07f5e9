// The per-stage pipeline executor (the schedules are parallel/schedule.cpp). Tags: the activation of micro-batch
// m travels with tag 2m, its gradient with tag 2m + 1 (peers differ by direction, so the tags only
// have to be unique per micro-batch).
#include "parallel/pipeline.h"

#include <algorithm>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "core/timer.h"

namespace moe::parallel {

namespace {

// Slots of activation size, reused once free (ids only: the storage is allocated separately, once
// the step's peak is known).
class SlotPool {
 public:
  int acquire() {
    if (!free_.empty()) {
      int id = free_.back();
      free_.pop_back();
      return id;
    }
    return count_++;
  }
  void release(int id) {
    if (id >= 0) free_.push_back(id);
  }
  int count() const { return count_; }

 private:
  int count_ = 0;
  std::vector<int> free_;
};

}  // namespace

// Long (127 lines): the op loop runs twice (a dry pass that counts buffer slots, then the real
// one) in one lambda over the same slots, requests and timers; see the comment inside.
PipelineTimes run_pipeline(const comm::Group& pp, Schedule schedule, int M,
                           size_t activation_floats, const StageCallbacks& callbacks,
                           MemTracker* comm_mem, Device device) {
  const double t_start = now_seconds();
  MOE_CHECK(M >= 1, "run_pipeline: micro-batches M = ", M, " (must be >= 1)");
  MOE_CHECK(M <= 16383, "run_pipeline: micro-batches M = ", M,
            " exceeds 16383 (tags 2M+1 must stay within MPI's guaranteed tag bound 32767)");
  MOE_CHECK(callbacks.forward && callbacks.backward, "run_pipeline: the ",
            !callbacks.forward ? "forward" : "backward", " callback is not set");
  MOE_CHECK(pp.valid(), "run_pipeline: the pipeline group is not valid");
  const int stage = pp.rank(), num_stages = pp.size();
  const bool first = stage == 0, last = stage == num_stages - 1;
  MOE_CHECK(num_stages == 1 || activation_floats > 0, "run_pipeline: activation_floats = 0 with ",
            num_stages, " stages");
  const std::vector<PipeOp> ops = make_schedule(schedule, num_stages, stage, M);
  const int64_t n = static_cast<int64_t>(activation_floats);

  PipelineTimes t;
  // Sends to the next stage (activations) are retired when its gradient messages prove them
  // received; sends to the previous stage (gradients) when its activation messages do.
  const std::vector<int> xout_done =
      last ? std::vector<int>() : implied_done(make_schedule(schedule, num_stages, stage + 1, M),
                                               /*neighbour_sends_fwd=*/false, M);
  const std::vector<int> dx_done =
      first ? std::vector<int>() : implied_done(make_schedule(schedule, num_stages, stage - 1, M),
                                                /*neighbour_sends_fwd=*/true, M);

  // The op loop runs twice. The dry pass does every acquire/release of buffer slots in the same
  // order but no communication and no callbacks: it gives the number of buffers the step needs.
  // They are then allocated (pages touched) before the first op, so that no op on the critical
  // path pays the page faults of a fresh buffer (~0.15 ms per 256 KiB on a VM: per op, that
  // showed up as bubble). The storage outlives the requests of the real pass: on an error path a
  // pending receive is cancelled before its buffer is freed. (A pending send is only detached; an
  // error inside a step leaves the pipeline's peers blocked anyway, and the caller ends the job.)
  Buffer<float> storage;
  auto execute = [&](bool dry) -> int {
    SlotPool pool;
    auto data = [&](int slot) {
      return storage.data() + static_cast<size_t>(slot) * activation_floats;
    };
    std::vector<int> x_in_buf(M, -1), x_out_buf(M, -1), dy_buf(M, -1), dx_buf(M, -1);
    std::vector<comm::Request> x_in_req(M), x_out_req(M), dy_req(M), dx_req(M);
    int x_out_retired = 0, dx_retired = 0;  // sends waited for, in micro-batch order

    auto wait_timed = [&](comm::Request& r) {
      if (dry) return;
      double t0 = now_seconds();
      r.wait();
      t.wait_s += now_seconds() - t0;
    };
    auto post_x_in = [&](int m) {
      x_in_buf[m] = pool.acquire();
      if (!dry) x_in_req[m] = pp.irecv(data(x_in_buf[m]), n, stage - 1, 2 * m);
    };
    // Waits for the sends that a received message proves complete and frees their buffers.
    auto retire = [&](std::vector<comm::Request>& reqs, std::vector<int>& bufs, int& retired,
                      int upto) {
      for (; retired < upto; ++retired) {
        wait_timed(reqs[retired]);
        pool.release(bufs[retired]);
        bufs[retired] = -1;
      }
    };
    // An op's input message, waited for; it proves the sends it answers complete, up to upto.
    auto receive = [&](comm::Request& in, std::vector<comm::Request>& sends, std::vector<int>& bufs, int& retired,
                       int upto) {
      wait_timed(in);
      retire(sends, bufs, retired, upto);
    };
    // A callback, timed as compute (the dry pass runs none).
    auto compute = [&](auto&& callback) {
      if (dry) return;
      ScopedTimer st(t.compute_s);
      callback();
    };

    if (!first) post_x_in(0);
    int open = 0;
    for (const PipeOp& op : ops) {
      const int m = op.micro_batch;
      if (op.forward) {
        if (!first) {
          if (m + 1 < M) post_x_in(m + 1);  // ahead of need: lands during this compute
          receive(x_in_req[m], dx_req, dx_buf, dx_retired, dx_done[m]);
        }
        if (!last) x_out_buf[m] = pool.acquire();
        compute([&] {
          callbacks.forward(m, first ? nullptr : data(x_in_buf[m]), last ? nullptr : data(x_out_buf[m]));
        });
        ++open;
        t.max_in_flight = std::max(t.max_in_flight, open);
        if (!first) {
          pool.release(x_in_buf[m]);
          x_in_buf[m] = -1;
        }
        if (!last) {
          dy_buf[m] = pool.acquire();  // the matching gradient may come back as soon as it can
          if (!dry) {
            x_out_req[m] = pp.isend(data(x_out_buf[m]), n, stage + 1, 2 * m);
            dy_req[m] = pp.irecv(data(dy_buf[m]), n, stage + 1, 2 * m + 1);
          }
        }
      } else {
        if (!last) receive(dy_req[m], x_out_req, x_out_buf, x_out_retired, xout_done[m]);
        if (!first) dx_buf[m] = pool.acquire();
        compute([&] {
          callbacks.backward(m, last ? nullptr : data(dy_buf[m]), first ? nullptr : data(dx_buf[m]));
        });
        --open;
        if (!last) {
          pool.release(dy_buf[m]);
          dy_buf[m] = -1;
        }
        if (!first && !dry) dx_req[m] = pp.isend(data(dx_buf[m]), n, stage - 1, 2 * m + 1);
      }
    }
    // Every send completes before return.
    if (!last) retire(x_out_req, x_out_buf, x_out_retired, M);
    if (!first) retire(dx_req, dx_buf, dx_retired, M);
    return pool.count();
  };

  const int slots = execute(/*dry=*/true);
  t.max_in_flight = 0;
  storage.resize(static_cast<size_t>(slots) * activation_floats, comm_mem, device);
  execute(/*dry=*/false);

  t.comm_bytes = storage.bytes();
  t.total_s = now_seconds() - t_start;
  return t;
}

}  // namespace moe::parallel
