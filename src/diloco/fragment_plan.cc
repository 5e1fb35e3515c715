#include "atoll/diloco/fragment_plan.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>
#include <utility>
#include <set>
#include <string_view>

#include "atoll/core/format.h"

namespace atl::diloco {
namespace {

// A unit of packing: a whole tensor or a row block of one.
struct Item {
  int tensor;
  int64_t offset;
  int64_t count;
};

// Elements per row of the first dimension (the whole tensor for a scalar).
int64_t RowSize(const TensorSpec& t) {
  if (t.shape.empty()) return t.numel;
  return t.numel / t.shape[0];
}

// Cuts tensors larger than `threshold` into near-equal row blocks of at most `threshold`
// elements (or one row, if a row is larger). Blocks keep row order.
std::vector<Item> MakeItems(const std::vector<TensorSpec>& tensors, bool split, double threshold) {
  std::vector<Item> items;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    const TensorSpec& t = tensors[static_cast<size_t>(i)];
    if (!split || static_cast<double>(t.numel) <= threshold) {
      items.push_back({i, 0, t.numel});
      continue;
    }
    const int64_t row = RowSize(t);
    const int64_t rows = t.numel / row;
    const int64_t max_rows = std::max<int64_t>(1, static_cast<int64_t>(threshold / static_cast<double>(row)));
    const int64_t blocks = (rows + max_rows - 1) / max_rows;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * rows / blocks;
      const int64_t r1 = (b + 1) * rows / blocks;
      items.push_back({i, r0 * row, (r1 - r0) * row});
    }
  }
  return items;
}

void Finish(FragmentPlan& plan) {
  int64_t peak = 0;
  for (auto& f : plan.fragments) {
    std::sort(f.slices.begin(), f.slices.end(), [](const TensorSlice& a, const TensorSlice& b) {
      return a.tensor != b.tensor ? a.tensor < b.tensor : a.offset < b.offset;
    });
    f.numel = 0;
    for (const auto& s : f.slices) f.numel += s.count;
    peak = std::max(peak, f.numel);
  }
  plan.peak_to_ideal = static_cast<double>(peak) / plan.ideal_numel;
}

void AddSlice(FragmentPlan& plan, int p, const Item& it) {
  plan.fragments[static_cast<size_t>(p)].slices.push_back(
      {it.tensor, it.offset, it.count, plan.tensors[static_cast<size_t>(it.tensor)].is_embedding});
}

void PackBalanced(FragmentPlan& plan, std::vector<Item> items) {
  const auto& tensors = plan.tensors;
  std::sort(items.begin(), items.end(), [&tensors](const Item& a, const Item& b) {
    if (a.count != b.count) return a.count > b.count;
    const auto& na = tensors[static_cast<size_t>(a.tensor)].name;
    const auto& nb = tensors[static_cast<size_t>(b.tensor)].name;
    if (na != nb) return na < nb;
    return a.offset < b.offset;
  });
  // Min-heap on (load, index): the lightest fragment, ties to the lowest index.
  using Entry = std::pair<int64_t, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> lightest;
  for (int p = 0; p < static_cast<int>(plan.fragments.size()); ++p) lightest.push({0, p});
  for (const Item& it : items) {
    auto [load, p] = lightest.top();
    lightest.pop();
    AddSlice(plan, p, it);
    lightest.push({load + it.count, p});
  }
}

// The layer number of a name with a "layers.<i>" / "blocks.<i>" / "h.<i>" component, or -1.
int64_t LayerOf(std::string_view name) {
  for (std::string_view key : {"layers.", "blocks.", "h."}) {
    size_t pos = 0;
    while ((pos = name.find(key, pos)) != std::string_view::npos) {
      const bool component_start = pos == 0 || name[pos - 1] == '.';
      size_t i = pos + key.size();
      int64_t layer = 0;
      size_t digits = 0;
      while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 15) {
        layer = layer * 10 + (name[i] - '0');
        ++i;
        ++digits;
      }
      const bool component_end = i == name.size() || name[i] == '.';
      if (component_start && digits > 0 && component_end) return layer;
      pos += 1;
    }
  }
  return -1;
}

void PackStrided(FragmentPlan& plan) {
  const int64_t P = static_cast<int64_t>(plan.fragments.size());
  int64_t num_layers = 0;
  std::vector<int> others;
  for (int i = 0; i < static_cast<int>(plan.tensors.size()); ++i) {
    const int64_t layer = LayerOf(plan.tensors[static_cast<size_t>(i)].name);
    if (layer >= 0) {
      num_layers = std::max(num_layers, layer + 1);
      AddSlice(plan, static_cast<int>(layer % P), {i, 0, plan.tensors[static_cast<size_t>(i)].numel});
    } else {
      others.push_back(i);
    }
  }
  std::sort(others.begin(), others.end(), [&plan](int a, int b) {
    return plan.tensors[static_cast<size_t>(a)].name < plan.tensors[static_cast<size_t>(b)].name;
  });
  for (size_t k = 0; k < others.size(); ++k) {
    const int64_t p = (num_layers + static_cast<int64_t>(k)) % P;
    AddSlice(plan, static_cast<int>(p), {others[k], 0, plan.tensors[static_cast<size_t>(others[k])].numel});
  }
}

}  // namespace

StatusOr<FragmentPlan> MakeFragmentPlan(const std::vector<TensorSpec>& tensors, const PlanOptions& options) {
  if (options.num_fragments < 1) {
    return InvalidArgumentError("fragment plan: need at least 1 fragment, got " +
                                std::to_string(options.num_fragments));
  }
  if (tensors.empty()) return InvalidArgumentError("fragment plan: no tensors");
  std::set<std::string_view> names;
  int64_t total = 0;
  for (const auto& t : tensors) {
    for (int64_t d : t.shape) {
      if (d <= 0) {
        return InvalidArgumentError("fragment plan: tensor '" + t.name + "' has a dimension " + std::to_string(d) +
                                    " ≤ 0");
      }
    }
    if (t.numel <= 0 || t.numel != NumelOf(t.shape)) {
      return InvalidArgumentError("fragment plan: tensor '" + t.name + "' has numel " + std::to_string(t.numel) +
                                  " but its shape holds " + std::to_string(NumelOf(t.shape)));
    }
    if (!names.insert(t.name).second) {
      return InvalidArgumentError("fragment plan: tensor name '" + t.name + "' repeats");
    }
    total += t.numel;
  }
  if (options.num_fragments > total) {
    return InvalidArgumentError("fragment plan: " + std::to_string(options.num_fragments) + " fragments for only " +
                                std::to_string(total) + " elements");
  }

  FragmentPlan plan;
  plan.tensors = tensors;
  plan.total_numel = total;
  plan.ideal_numel = static_cast<double>(total) / options.num_fragments;
  auto reset = [&plan, &options] {
    plan.fragments.assign(static_cast<size_t>(options.num_fragments), Fragment{});
    for (int p = 0; p < options.num_fragments; ++p) plan.fragments[static_cast<size_t>(p)].index = p;
  };
  reset();
  if (options.strategy == PlanStrategy::kStrided) {
    PackStrided(plan);
    Finish(plan);
    return plan;
  }
  PackBalanced(plan, MakeItems(tensors, options.split_large, plan.ideal_numel));
  Finish(plan);
  if (options.split_large && plan.peak_to_ideal > 4.0 / 3.0) {
    // LPT's peak is at most ideal + the last item placed on it: items ≤ ideal/3 bound it by 4/3.
    reset();
    PackBalanced(plan, MakeItems(tensors, true, plan.ideal_numel / 3.0));
    Finish(plan);
  }
  return plan;
}

std::string DescribePlan(const FragmentPlan& plan) {
  std::string out;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%zu tensors, %s elements, P=%d, ideal %s elements/fragment, peak/ideal %.3f\n",
                plan.tensors.size(), Grouped(plan.total_numel).c_str(), plan.num_fragments(),
                Grouped(static_cast<int64_t>(plan.ideal_numel + 0.5)).c_str(), plan.peak_to_ideal);
  out += buf;
  for (const auto& f : plan.fragments) {
    std::snprintf(buf, sizeof(buf), "fragment %2d: %9s elements (%.2f× ideal):", f.index, Grouped(f.numel).c_str(),
                  static_cast<double>(f.numel) / plan.ideal_numel);
    out += buf;
    if (f.slices.empty()) out += " (empty)";
    for (size_t i = 0; i < f.slices.size(); ++i) {
      const TensorSlice& s = f.slices[i];
      const TensorSpec& t = plan.tensors[static_cast<size_t>(s.tensor)];
      out += i == 0 ? " " : ", ";
      out += t.name;
      if (s.count != t.numel) {
        const int64_t row = RowSize(t);
        out += "[rows " + std::to_string(s.offset / row) + ":" + std::to_string((s.offset + s.count) / row) + "]";
      }
    }
    out += '\n';
  }
  return out;
}

Status Schedule::Validate() const {
  if (P < 1 || P > H) {
    return InvalidArgumentError("schedule: need 1 ≤ P ≤ H, got P=" + std::to_string(P) + " H=" + std::to_string(H));
  }
  if (tau < 0 || tau >= H) {
    return InvalidArgumentError("schedule: need 0 ≤ τ < H, got τ=" + std::to_string(tau) + " H=" + std::to_string(H));
  }
  return Status::Ok();
}

int Schedule::SendOffset(int p) const {
  ATOLL_CHECK(Validate().ok());
  ATOLL_CHECK(p >= 0 && p < P);
  return static_cast<int>(static_cast<int64_t>(p) * H / P);
}

int Schedule::FragmentAt(int64_t step) const {
  ATOLL_CHECK(Validate().ok());
  if (step < 0) return -1;
  const int64_t o = step % H;
  // Offsets floor(p·H/P) strictly increase with p (H ≥ P): the only candidate is the smallest p
  // with p·H/P ≥ o.
  const int64_t p = (o * P + H - 1) / H;
  if (p < P && p * H / P == o) return static_cast<int>(p);
  return -1;
}

std::vector<int> Schedule::FragmentsAt(int64_t step) const {
  std::vector<int> out;
  if (synchronous) {
    ATOLL_CHECK(Validate().ok());
    if (step >= 0 && (step + 1) % H == 0) {
      for (int p = 0; p < P; ++p) out.push_back(p);
    }
    return out;
  }
  if (const int p = FragmentAt(step); p >= 0) out.push_back(p);
  return out;
}

}  // namespace atl::diloco
