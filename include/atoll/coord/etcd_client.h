// EtcdClient: the few calls of etcd's v3 API that atoll's coordination needs (leases, one key at
// a time, and put-if-absent / delete-if-lease transactions), over gRPC to one etcd cluster. No
// TLS and no etcd authentication: etcd is reached over a trusted network or a unix socket.
//
// Endpoints: a comma-separated list of `host:port`, `http://host:port` or `unix:/absolute/path`.
// Every call has a deadline (the client's call timeout) and goes to one endpoint; when that
// endpoint is unreachable the call moves on to the next, within the same deadline. Errors name
// etcd, the endpoint and the call, with gRPC's code kept (they equal atl::StatusCode).
// Thread-safety: every method may be called from any thread; KeepAliveOnce calls are serialized
// (they share one stream).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "atoll/core/status.h"

namespace atl::coord {

// One key as etcd stores it.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // etcd's store revision when the key was created (> 0)
  int64_t mod_revision = 0;     // ... when it was last modified
  int64_t lease = 0;            // the lease it is bound to; 0: none
};

struct PutIfAbsentResult {
  bool created = false;
  KeyValue existing;     // the key as it was, when !created
  int64_t revision = 0;  // the store revision after the transaction (the key's create_revision when created)
};

// Splits and checks an endpoint list; returns gRPC targets (`host:port`, `unix:/path`).
StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& endpoints);

class EtcdClient {
 public:
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Connects and checks that the cluster answers (a read of one key) within `dial_timeout_s`:
  // Unavailable "etcd at <endpoints> did not answer within N s: <cause>" otherwise;
  // InvalidArgument for an empty or malformed endpoint list. `call_timeout_s` (0: the dial
  // timeout) bounds every later call.
  static StatusOr<std::unique_ptr<EtcdClient>> Connect(const std::string& endpoints, double dial_timeout_s,
                                                       double call_timeout_s = 0);

  const std::string& endpoints() const { return endpoints_; }

  // A new lease of `ttl_s` seconds; returns its id. `granted_ttl_s`, if given, receives the TTL
  // etcd granted (etcd raises a TTL below its minimum, which depends on its election timeout).
  StatusOr<int64_t> Grant(int64_t ttl_s, int64_t* granted_ttl_s = nullptr);
  // Renews `lease` once (one request and its reply on the client's LeaseKeepAlive stream, which
  // stays open across calls and is opened again after an error). Returns the renewed TTL in
  // seconds; NotFound when the lease has expired or was revoked. `timeout_s` 0: the call timeout.
  StatusOr<int64_t> KeepAliveOnce(int64_t lease, double timeout_s = 0);
  // Revokes `lease`: every key bound to it is deleted. A lease that is already gone is OK.
  Status Revoke(int64_t lease);

  // The key, or nullopt when it does not exist.
  StatusOr<std::optional<KeyValue>> Get(const std::string& key);
  // Puts `value` (bound to `lease`; 0: none).
  Status Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Creates the key only if it does not exist, in one transaction; else returns it as it is.
  StatusOr<PutIfAbsentResult> PutIfAbsent(const std::string& key, const std::string& value, int64_t lease);
  // Deletes the key; returns whether it existed.
  StatusOr<bool> Delete(const std::string& key);
  // Puts `value` (no lease) only if `guard` is bound to `lease` (one transaction); returns whether
  // it did.
  StatusOr<bool> PutIfBound(const std::string& key, const std::string& value, const std::string& guard, int64_t lease);
  // Deletes the key only if it is bound to `lease` (one transaction); returns whether it did.
  StatusOr<bool> DeleteIf(const std::string& key, int64_t lease);

  struct Impl;

 private:
  explicit EtcdClient(std::unique_ptr<Impl> impl, std::string endpoints);
  std::unique_ptr<Impl> impl_;
  std::string endpoints_;
};

}  // namespace atl::coord
