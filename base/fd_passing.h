#pragma once
// Descriptors passed between processes over a unix socket (SCM_RIGHTS), with a fixed-size header
// in the same message: how the launcher hands the spare template a spare's pipes and socket, and
// a template forked from a rank its output (rendezvous/spare_fork.h declares those messages).
// Both sides of that socket use these, so the cmsg set-up is written once. Plain syscalls, EINTR
// retried; nothing allocates.
#include <sys/types.h>

#include <cstddef>
#include <span>

namespace ddprun {

// At most this many descriptors ride on one message (the receive buffer's size).
inline constexpr size_t kMaxPassedFds = 8;

// Sends `len` bytes of `head` with `fds` attached (at most kMaxPassedFds; none is fine). Returns
// sendmsg's count: the bytes of `head` sent (the descriptors go with the first), or -1 (errno).
// `flags` adds to MSG_NOSIGNAL (MSG_DONTWAIT, say).
ssize_t sendWithFds(int sock, const void* head, size_t len, std::span<const int> fds,
                    int flags = 0);

// Receives up to `len` bytes into `head` and the descriptors that came with them, close-on-exec,
// into `fds`; `got` says how many. Descriptors beyond fds.size() are closed, never leaked.
// Returns recvmsg's count (0: EOF; -1: errno, and then `got` is 0).
ssize_t receiveWithFds(int sock, void* head, size_t len, std::span<int> fds, size_t& got);

// The whole of `data` sent on a socket (MSG_NOSIGNAL): false on error or a closed peer.
bool sendAll(int sock, const void* data, size_t n);

// Exactly `n` bytes read: false on EOF or error.
bool readAll(int fd, void* data, size_t n);

}  // namespace ddprun
