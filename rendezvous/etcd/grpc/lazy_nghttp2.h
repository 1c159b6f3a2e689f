#pragma once
// libnghttp2 loaded on first use (docs/rendezvous.md, "What an agent process costs").
//
// The concept: only the etcd-v3 backend's gRPC transport (connection.cpp) calls libnghttp2, yet
// linking it made every process that can run that backend -- every agent, at every start, etcd
// or not -- map it and let the dynamic loader relocate it (9 page faults and ~18 K
// instructions of the ~4 ms of CPU an agent of a 2-node job takes here). As for OpenSSL
// (rendezvous/openssl/lazy_openssl.h), this target defines each libnghttp2 function
// connection.cpp calls as a forwarder (lazy_nghttp2.cpp, with the prototypes of nghttp2.h, so
// the compiler checks every one): its first call dlopen()s the system's library by the soname
// the linker would have recorded (DDPRUN_NGHTTP2_SONAME, found by CMake: libnghttp2.so.14 on
// Debian 12) and looks the function up there; later calls go straight through. The library
// is still the one the system installs and updates: only *when* it is loaded changes. A
// process that never opens an etcd gRPC connection never loads it.
//
// Contract: the forwarders are hidden (never exported, so a shared library loaded into the
// same process binds to the real libnghttp2). A library or function that cannot be loaded ends
// the process at that first call with exit code 127 and one line naming the library and the
// function, as the dynamic loader would have at the start. A function connection.cpp newly
// calls must be added to the list in lazy_nghttp2.cpp, or the link fails naming it.
namespace ddprun::rendezvous::etcd::grpc {

// Whether libnghttp2 has been loaded into this process by now (by a forwarder or by anything
// else): for tests and the start-up measurements.
bool nghttp2Loaded();

}  // namespace ddprun::rendezvous::etcd::grpc
