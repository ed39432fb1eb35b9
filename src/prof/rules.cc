// Kernel-name classification: ordered regex rules, user rules first, first match wins.
#include <fstream>
#include <regex>
#include <sstream>

#include "molora/prof.h"

namespace molora::prof {
namespace {

const char* const kNames[kNumCategories] = {
    "moe",           "moe-lora", "attention",   "gemm",       "allreduce", "allgather",
    "reducescatter", "alltoall", "p2p",         "other-comm", "norm",      "elementwise",
    "routing",       "sampling", "speculative", "memcpy",     "memset",    "other"};

using C = Category;
struct Builtin {
  C c;
  const char* re;
};
// Order matters: specific families before the generic ones (molora's own kernels, LoRA, and
// routing before "moe"; every communication family before GEMM/elementwise).
const Builtin kBuiltin[] = {
    // molora's kernels: CUPTI reports demangled names ("molora::(anonymous
    // namespace)::molora_align_small(...)", "void molora::comm::(anonymous
    // namespace)::molora_allreduce_kernel<__nv_bfloat16, 1>(...)"), so no ^ anchor.
    {C::kMoeLora, R"(\bmolora_\w*(lora|shrink|expand))"},
    {C::kRouting, R"(\bmolora_\w*align)"},
    {C::kAllReduce, R"(\bmolora_\w*(all_?reduce|one_?shot|two_?shot))"},
    {C::kMoeLora,
     R"((moe|expert).*lora|lora.*(moe|expert)|sgmv|bgmv|punica|lora_(shrink|expand|a|b)\b|_lora_)"},
    {C::kAllReduce, R"(^nccl\w*AllReduce)"},
    {C::kAllGather, R"(^nccl\w*AllGather)"},
    {C::kReduceScatter, R"(^nccl\w*ReduceScatter)"},
    {C::kAllToAll, R"(^nccl\w*(AllToAll|Alltoall))"},
    {C::kP2p, R"(^nccl\w*(SendRecv|Send|Recv))"},
    {C::kOtherComm, R"(^nccl)"},
    {C::kAllReduce,
     R"(cross_device_reduce_|custom_?all_?reduce|allreduce_fusion|oneShotAllReduce|twoShotAllReduce|oneshot_all_?reduce|twoshot_all_?reduce|lamport|all_?reduce)"},
    {C::kAllGather, R"(all_?gather)"},
    {C::kReduceScatter, R"(reduce_?scatter)"},
    {C::kAllToAll,
     R"(all_?to_?all|deep_?ep|intranode::(dispatch|combine)|internode::(dispatch|combine))"},
    {C::kSpeculative,
     R"(eagle|draft|speculative|spec_decode|verify_tree|build_tree|tree_speculative)"},
    {C::kSampling, R"(sampling|sampler|multinomial|ArgMax|argmax|gumbel|top_?p_|min_p)"},
    {C::kAttention,
     R"(flash|fmha|BatchDecode|BatchPrefill|attention|attn|\bmla|_mla|paged|sdpa|xqa|cudnn.*mha|merge_state|reshape_and_cache|rotary|rope_|_rope)"},
    {C::kRouting,
     R"(moe_align|align_block_size|topk|TopK|top_k|gating|router|count_and_sort|[Ss]ort|SoftMax|softmax)"},
    {C::kMoe, R"(fused_moe|moe|MoE|Moe|expert|grouped_gemm|m_grouped)"},
    {C::kGemm,
     R"(gemm|Gemm|GEMM|gemv|nvjet|cutlass|xmma|cublas|splitKreduce|matmul|wgmma|s\d+gemm)"},
    {C::kNorm, R"([Nn]orm|rms)"},
    {C::kElementwise,
     R"(elementwise|silu|gelu|act_and_mul|swiglu|relu|sigmoid|tanh|CatArrayBatchedCopy|index|gather|scatter|reduce_kernel|triton_(poi|red|per)|copy|fill|cast|where|add|mul)"},
};

}  // namespace

const char* category_name(Category c) {
  int i = static_cast<int>(c);
  return (i >= 0 && i < kNumCategories) ? kNames[i] : "other";
}

bool parse_category(const std::string& name, Category* out) {
  for (int i = 0; i < kNumCategories; ++i)
    if (name == kNames[i]) {
      *out = static_cast<Category>(i);
      return true;
    }
  if (name == "send-recv" || name == "sendrecv") return *out = Category::kP2p, true;
  if (name == "activation") return *out = Category::kElementwise, true;
  return false;
}

bool is_comm(Category c) {
  return c == C::kAllReduce || c == C::kAllGather || c == C::kReduceScatter || c == C::kAllToAll ||
         c == C::kP2p || c == C::kOtherComm;
}

struct Rules::Impl {
  std::vector<Rule> rules;
  std::vector<std::regex> res;
};

Rules::Rules() : impl_(new Impl) {
  int i = 0;
  for (const auto& b : kBuiltin) {
    impl_->rules.push_back({b.c, b.re, "builtin:" + std::to_string(i++)});
    impl_->res.emplace_back(b.re, std::regex::ECMAScript | std::regex::optimize);
  }
}
Rules::~Rules() { delete impl_; }
Rules::Rules(const Rules& o) : impl_(new Impl(*o.impl_)) {}
Rules& Rules::operator=(const Rules& o) {
  if (this != &o) *impl_ = *o.impl_;
  return *this;
}

const std::vector<Rule>& Rules::rules() const { return impl_->rules; }

Status Rules::add_front(Category c, const std::string& pattern, const std::string& origin) {
  try {
    std::regex re(pattern, std::regex::ECMAScript | std::regex::optimize);
    impl_->rules.insert(impl_->rules.begin(), Rule{c, pattern, origin});
    impl_->res.insert(impl_->res.begin(), std::move(re));
  } catch (const std::regex_error& e) {
    return Status::InvalidArgument(origin + ": bad regex '" + pattern + "': " + e.what());
  }
  return Status::Ok();
}

Status Rules::add_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Status::IoError(path + ": cannot open rules file");
  std::vector<std::pair<Category, std::pair<std::string, std::string>>> got;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    size_t a = line.find_first_not_of(" \t\r");
    if (a == std::string::npos || line[a] == '#') continue;
    size_t b = line.find_first_of(" \t", a);
    std::string where = path + ":" + std::to_string(n);
    if (b == std::string::npos)
      return Status::InvalidArgument(where + ": expected '<category> <regex>'");
    std::string cat = line.substr(a, b - a);
    size_t r = line.find_first_not_of(" \t", b);
    std::string re = r == std::string::npos ? "" : line.substr(r);
    while (!re.empty() && (re.back() == '\r' || re.back() == ' ')) re.pop_back();
    Category c;
    if (!parse_category(cat, &c))
      return Status::InvalidArgument(where + ": unknown category '" + cat + "'");
    // memcpy/memset are the copy events' rows, not kernel categories: a kernel sent there
    // would vanish from the summary's category table.
    if (c == Category::kMemcpy || c == Category::kMemset)
      return Status::InvalidArgument(where + ": category '" + cat +
                                     "' is for memcpy/memset events, not kernel rules");
    if (re.empty()) return Status::InvalidArgument(where + ": empty regex");
    got.push_back({c, {re, where}});
  }
  // Keep the file's order, all before the current rules.
  for (auto it = got.rbegin(); it != got.rend(); ++it)
    MOLORA_RETURN_IF_ERROR(add_front(it->first, it->second.first, it->second.second));
  return Status::Ok();
}

Category Rules::classify(const std::string& name, int* rule) const {
  for (size_t i = 0; i < impl_->res.size(); ++i)
    if (std::regex_search(name, impl_->res[i])) {
      if (rule) *rule = static_cast<int>(i);
      return impl_->rules[i].category;
    }
  if (rule) *rule = -1;
  return Category::kOther;
}

std::string explain(const Rules& rules, const std::string& name) {
  int r = -1;
  Category c = rules.classify(name, &r);
  std::ostringstream o;
  o << name << " -> " << category_name(c);
  if (r >= 0)
    o << " (rule " << r << ": /" << rules.rules()[r].pattern << "/ from " << rules.rules()[r].origin
      << ")";
  else
    o << " (no rule matched)";
  o << "\n";
  return o.str();
}

}  // namespace molora::prof
