// Status and StatusOr<T>: atoll's one error currency.
//
// Faults that come from outside the process (peers, the network, the disk, user input) are
// returned as a Status carrying the cause. Bugs (violated invariants) abort with file:line via
// ATOLL_CHECK. The code says what the caller should do:
//   kUnavailable        retry the call later (peer down, network partition)
//   kAborted            retry the round (a race lost, a version moved on)
//   kDeadlineExceeded   the operation ran past its bound
//   kInvalidArgument    stop and say why (bad flag, bad message, bad file)
//   kFailedPrecondition stop and say why (wrong state, mismatched run or model)
//   kNotFound, kAlreadyExists, kDataLoss (checksum mismatch, truncated file),
//   kUnauthenticated, kPermissionDenied, kResourceExhausted, kInternal, kUnimplemented.
// Thread-safety: values; safe to copy and move across threads.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace atl {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};
// The numeric values equal gRPC's status codes so the transport can map them 1:1.

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Returns a copy with `context + ": "` prepended to the message (keeps the code).
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) { return a.code_ == b.code_ && a.message_ == b.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

inline Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExistsError(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status AbortedError(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status UnimplementedError(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status UnauthenticatedError(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }
inline Status PermissionDeniedError(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status ResourceExhaustedError(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const std::string& msg);

// StatusOr<T>: either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : value_(value) {}             // NOLINT(implicit)
  StatusOr(T&& value) : value_(std::move(value)) {}       // NOLINT(implicit)
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT(implicit)
    if (status_.ok()) CheckFailed(__FILE__, __LINE__, "!status.ok()", "StatusOr built from OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    Require();
    return *value_;
  }
  T& value() & {
    Require();
    return *value_;
  }
  T&& value() && {
    Require();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void Require() const {
    if (!value_) CheckFailed(__FILE__, __LINE__, "ok()", "value() on error: " + status_.ToString());
  }
  Status status_;
  std::optional<T> value_;
};

}  // namespace atl

// ATOLL_CHECK(cond) << nothing: aborts with file:line and the expression when cond is false.
// For bugs only; never for faults from peers, the network or user input.
#define ATOLL_CHECK(cond)                                           \
  do {                                                              \
    if (!(cond)) ::atl::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define ATOLL_CHECK_MSG(cond, msg)                                     \
  do {                                                                 \
    if (!(cond)) ::atl::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#define ATOLL_CONCAT_INNER(a, b) a##b
#define ATOLL_CONCAT(a, b) ATOLL_CONCAT_INNER(a, b)

#define ATOLL_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::atl::Status _atoll_st = (expr);      \
    if (!_atoll_st.ok()) return _atoll_st; \
  } while (0)

#define ATOLL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

// ATOLL_ASSIGN_OR_RETURN(auto x, MakeX()): unwraps a StatusOr or returns its error.
#define ATOLL_ASSIGN_OR_RETURN(lhs, expr) ATOLL_ASSIGN_OR_RETURN_IMPL(ATOLL_CONCAT(_atoll_sor_, __LINE__), lhs, expr)
