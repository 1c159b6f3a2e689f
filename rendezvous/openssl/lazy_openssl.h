#pragma once
// OpenSSL loaded on first use (rendezvous/openssl/, docs/launcher.md#start-up-cost).
//
// The concept: ddprun calls OpenSSL only for the store's token (HMAC-SHA256, auth.h) and for
// etcd over TLS (rendezvous/etcd/http_connection.cpp), yet linking libssl and libcrypto made
// every process that runs the store client -- every agent, at every start -- map them and let
// the dynamic loader relocate libcrypto (about 20,000 relocations and 100 pages copied on
// write: ~0.7 ms of the ~2 ms `ddprun --version` took). This target defines each OpenSSL
// function ddprun's code calls (lazy_openssl.cpp, with the prototypes of OpenSSL's own
// headers, so the compiler checks every one) as a forwarder: its first call dlopen()s the
// system's library by its soname (libssl.so.3 / libcrypto.so.3) and looks the function up
// there; later calls go straight through. The library is still the one the system installs
// and updates (not a static copy): only *when* it is loaded changes. A process that never
// uses a token or TLS never loads it.
//
// Contract: the forwarders are hidden (never exported, so a shared library loaded into the
// same process binds to the real OpenSSL, not to them). A library or function that cannot be
// loaded ends the process at that first call with exit code 127 and one line naming the
// library and the function, as the dynamic loader would have at the start. A function ddprun
// newly calls must be added to the list in lazy_openssl.cpp, or the link fails naming it.
// -DDDPRUN_LAZY_OPENSSL=OFF links OpenSSL as before.
namespace ddprun::rendezvous::openssl {

// Whether libcrypto has been loaded into this process by now (by a forwarder or by anything
// else): for tests and the start-up measurements.
bool cryptoLoaded();

}  // namespace ddprun::rendezvous::openssl
