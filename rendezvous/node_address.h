#pragma once
// Addresses of this node, as the multi-node rendezvous needs them: the address it advertises
// to the other nodes, a free port for MASTER_PORT, and whether a rendezvous endpoint names
// this node (then its agent hosts the store).
#include <cstdint>
#include <string>

namespace ddprun::rendezvous {

// The local address of the interface that routes to host:port (a UDP connect sends nothing),
// i.e. the address the other nodes reach us on when no --local-addr is given. Falls back to
// the host name when the route cannot be found.
std::string addressToward(const std::string& host, uint16_t port);

// A TCP port that is free on every local address at the time of the call.
uint16_t pickFreePort();

// Whether `endpointHost` is this node. With `localAddr` (--local-addr), only that address
// counts (several "nodes" may share a machine); otherwise any address of this machine does
// (tried by binding to it), as does the machine's host name or "localhost".
bool endpointIsThisNode(const std::string& endpointHost, const std::string& localAddr);

}  // namespace ddprun::rendezvous
