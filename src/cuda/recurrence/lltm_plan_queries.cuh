// What the plans of the cluster and persistent kernels share for their
// CUDA queries: query_failed, and KeptAnswers, which keeps their answers.
// Its own header: <mutex> adds half a second to each file that parses it
// (nvcc 13.0, the 2-core development machine), and the recurrence's other
// files ask the device nothing.
#ifndef LLTM_PLAN_QUERIES_CUH
#define LLTM_PLAN_QUERIES_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include <array>
#include <mutex>

// False where a CUDA query succeeded; else true, its error cleared.
static inline bool query_failed(cudaError_t status) {
  if (status == cudaSuccess) return false;
  (void)cudaGetLastError();
  return true;
}

// The answers of a plan's CUDA queries (a kernel's attributes, its
// occupancy), kept by their question: they never change for a device and
// a layout, they cost the host microseconds a call, and a pass may be
// planned while a CUDA graph is captured. ask(&answer) makes the queries
// and returns false where one failed: that answer is not kept. The last
// 64 questions are.
template <typename Answer>
class KeptAnswers {
 public:
  typedef std::array<int64_t, 5> Question;

  template <typename Ask>
  Answer get(const Question& question, Ask ask) {
    std::lock_guard<std::mutex> guard(lock_);
    for (int i = 0; i < count_; ++i) {
      if (questions_[i] == question) return answers_[i];
    }
    Answer answer;
    if (!ask(&answer)) return answer;
    questions_[next_] = question;
    answers_[next_] = answer;
    next_ = (next_ + 1) % kKept;
    if (count_ < kKept) ++count_;
    return answer;
  }

 private:
  static const int kKept = 64;
  Question questions_[kKept];
  Answer answers_[kKept];
  int count_ = 0, next_ = 0;
  std::mutex lock_;
};

#endif  // LLTM_PLAN_QUERIES_CUH
