// The C API's fragment queries (include/atoll/c_api.h, version 2): the plan's slices, the sends a
// step scheduled and those waiting for staged values, the receipts it wrote.
#include <cstring>
#include <string>
#include <vector>

#include "c_api_internal.h"

namespace {

using atl::Status;
using atl::capi::Report;

// Copies `list` into out[0..capacity) through `convert`; the list's length goes to *count.
template <typename T, typename Out, typename Convert>
atoll_status ListOut(const std::vector<T>& list, Out* out, size_t capacity, size_t* count, Convert convert) {
  if (count == nullptr) return Report(atl::InvalidArgumentError("count must not be NULL"));
  *count = list.size();
  if (capacity < list.size()) {
    return Report(atl::InvalidArgumentError("capacity " + std::to_string(capacity) + " < " +
                                            std::to_string(list.size()) + " entries"));
  }
  if (!list.empty() && out == nullptr) return Report(atl::InvalidArgumentError("out must not be NULL"));
  for (size_t i = 0; i < list.size(); ++i) out[i] = convert(list[i]);
  return Report(Status::Ok());
}

Status CheckFragment(const atoll_learner* l, int fragment) {
  if (l == nullptr) return atl::InvalidArgumentError("learner is NULL");
  if (fragment < 0 || fragment >= l->plan.num_fragments()) {
    return atl::InvalidArgumentError("fragment " + std::to_string(fragment) + " (0.." +
                                     std::to_string(l->plan.num_fragments() - 1) + ")");
  }
  return Status::Ok();
}

int Same(int p) { return p; }

}  // namespace

extern "C" {

int atoll_learner_num_fragments(const atoll_learner* l) { return l == nullptr ? 0 : l->plan.num_fragments(); }

atoll_status atoll_learner_fragment_slices(const atoll_learner* l, int fragment, atoll_slice* out, size_t capacity,
                                           size_t* count) {
  if (Status st = CheckFragment(l, fragment); !st.ok()) return Report(st);
  return ListOut(l->plan.fragments[static_cast<size_t>(fragment)].slices, out, capacity, count,
                 [](const atl::diloco::TensorSlice& s) {
                   return atoll_slice{s.tensor, s.offset, s.count};
                 });
}

atoll_status atoll_learner_sends(const atoll_learner* l, int* out, size_t capacity, size_t* count) {
  if (l == nullptr) return Report(atl::InvalidArgumentError("learner is NULL"));
  return ListOut(l->agent->sent_at_last_step(), out, capacity, count, Same);
}

atoll_status atoll_learner_due(const atoll_learner* l, int* out, size_t capacity, size_t* count) {
  if (l == nullptr) return Report(atl::InvalidArgumentError("learner is NULL"));
  return ListOut(l->agent->DueAt(l->step), out, capacity, count, Same);
}

atoll_status atoll_learner_pending(const atoll_learner* l, int* out, size_t capacity, size_t* count) {
  if (l == nullptr) return Report(atl::InvalidArgumentError("learner is NULL"));
  return ListOut(l->agent->PendingSends(), out, capacity, count, Same);
}

int64_t atoll_learner_staged_count(const atoll_learner* l, int fragment) {
  return CheckFragment(l, fragment).ok() ? l->agent->staged_numel(fragment) : -1;
}

atoll_status atoll_learner_send(atoll_learner* l, int fragment, const float* values, size_t count) {
  if (Status st = CheckFragment(l, fragment); !st.ok()) return Report(st);
  if (values == nullptr && count > 0) return Report(atl::InvalidArgumentError("values must not be NULL"));
  return Report(l->agent->Send(fragment, std::span<const float>(values, count), l->step));
}

atoll_status atoll_learner_receipts(const atoll_learner* l, atoll_receipt* out, size_t capacity, size_t* count) {
  if (l == nullptr) return Report(atl::InvalidArgumentError("learner is NULL"));
  return ListOut(l->agent->receipts(), out, capacity, count, [](const atl::learner::LearnerAgent::Receipt& r) {
    return atoll_receipt{r.fragment, r.additive ? ATOLL_RECEIPT_ADD : ATOLL_RECEIPT_MIX};
  });
}

atoll_status atoll_learner_state_json(const atoll_learner* l, char* out, size_t capacity, size_t* length) {
  if (l == nullptr || length == nullptr)
    return Report(atl::InvalidArgumentError("learner and length must not be NULL"));
  const std::string text = atl::capi::StateJson(*l);
  *length = text.size();
  if (out == nullptr || capacity < text.size() + 1) {
    return Report(atl::InvalidArgumentError("capacity " + std::to_string(capacity) + " < " +
                                            std::to_string(text.size() + 1) + " bytes"));
  }
  std::memcpy(out, text.c_str(), text.size() + 1);
  return Report(Status::Ok());
}

}  // extern "C"
