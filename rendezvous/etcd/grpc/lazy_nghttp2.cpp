// The forwarders of lazy_nghttp2.h: one per libnghttp2 function connection.cpp calls.
#include "rendezvous/etcd/grpc/lazy_nghttp2.h"

#include <dlfcn.h>
#include <nghttp2/nghttp2.h>
#include <unistd.h>

#include <cstdio>

namespace ddprun::rendezvous::etcd::grpc {
namespace {

constexpr const char* kNghttp2 = DDPRUN_NGHTTP2_SONAME;

[[noreturn]] void cannotLoad(const char* function) {
  const char* why = ::dlerror();
  std::fprintf(stderr,
               "ddprun: cannot load %s for %s (%s): the libnghttp2 runtime is needed for "
               "--rdzv-backend=etcd-v3 over gRPC (Debian: libnghttp2-14)\n",
               kNghttp2, function, why ? why : "not found");
  std::fflush(stderr);
  ::_exit(127);
}

}  // namespace

void* lookUpNghttp2(const char* function);
void* lookUpNghttp2(const char* function) {
  // Loaded once per process (a thread-safe static); never closed.
  static void* const library = ::dlopen(kNghttp2, RTLD_NOW | RTLD_LOCAL);
  if (!library) cannotLoad(function);
  ::dlerror();
  void* fn = ::dlsym(library, function);
  if (!fn) cannotLoad(function);
  return fn;
}

bool nghttp2Loaded() {
  return ::dlopen(kNghttp2, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD) != nullptr;
}

}  // namespace ddprun::rendezvous::etcd::grpc

#ifndef DDPRUN_NGHTTP2_LINKED  // the library's file names no soname version: linked, no forwarders

// A forwarder: the function `name`, with nghttp2.h's own parameter list (a mismatch with the
// header's declaration does not compile), looked up once (a thread-safe static).
#define DDPRUN_FORWARD(ret, name, params, args)                                              \
  extern "C" __attribute__((visibility("hidden"))) ret name params {                        \
    using Fn = ret(*) params;                                                                \
    static const Fn fn =                                                                     \
        reinterpret_cast<Fn>(ddprun::rendezvous::etcd::grpc::lookUpNghttp2(#name));          \
    return fn args;                                                                          \
  }

// The session and its callbacks (Connection's constructor and destructor).
DDPRUN_FORWARD(int, nghttp2_session_callbacks_new, (nghttp2_session_callbacks** callbacks_ptr),
               (callbacks_ptr))
DDPRUN_FORWARD(void, nghttp2_session_callbacks_del, (nghttp2_session_callbacks* callbacks),
               (callbacks))
DDPRUN_FORWARD(void, nghttp2_session_callbacks_set_on_header_callback,
               (nghttp2_session_callbacks* cbs, nghttp2_on_header_callback on_header_callback),
               (cbs, on_header_callback))
DDPRUN_FORWARD(void, nghttp2_session_callbacks_set_on_data_chunk_recv_callback,
               (nghttp2_session_callbacks* cbs,
                nghttp2_on_data_chunk_recv_callback on_data_chunk_recv_callback),
               (cbs, on_data_chunk_recv_callback))
DDPRUN_FORWARD(void, nghttp2_session_callbacks_set_on_stream_close_callback,
               (nghttp2_session_callbacks* cbs,
                nghttp2_on_stream_close_callback on_stream_close_callback),
               (cbs, on_stream_close_callback))
DDPRUN_FORWARD(void, nghttp2_session_callbacks_set_on_frame_recv_callback,
               (nghttp2_session_callbacks* cbs,
                nghttp2_on_frame_recv_callback on_frame_recv_callback),
               (cbs, on_frame_recv_callback))
DDPRUN_FORWARD(void, nghttp2_session_callbacks_set_error_callback2,
               (nghttp2_session_callbacks* cbs, nghttp2_error_callback2 error_callback2),
               (cbs, error_callback2))
DDPRUN_FORWARD(int, nghttp2_session_client_new,
               (nghttp2_session** session_ptr, const nghttp2_session_callbacks* callbacks,
                void* user_data),
               (session_ptr, callbacks, user_data))
DDPRUN_FORWARD(void, nghttp2_session_del, (nghttp2_session* session), (session))
DDPRUN_FORWARD(int, nghttp2_session_set_local_window_size,
               (nghttp2_session* session, uint8_t flags, int32_t stream_id, int32_t window_size),
               (session, flags, stream_id, window_size))

// Frames in and out.
DDPRUN_FORWARD(ssize_t, nghttp2_session_mem_recv,
               (nghttp2_session* session, const uint8_t* in, size_t inlen), (session, in, inlen))
DDPRUN_FORWARD(ssize_t, nghttp2_session_mem_send,
               (nghttp2_session* session, const uint8_t** data_ptr), (session, data_ptr))
DDPRUN_FORWARD(int, nghttp2_session_want_read, (nghttp2_session* session), (session))
DDPRUN_FORWARD(int, nghttp2_submit_settings,
               (nghttp2_session* session, uint8_t flags, const nghttp2_settings_entry* iv,
                size_t niv),
               (session, flags, iv, niv))
DDPRUN_FORWARD(int32_t, nghttp2_submit_request,
               (nghttp2_session* session, const nghttp2_priority_spec* pri_spec,
                const nghttp2_nv* nva, size_t nvlen, const nghttp2_data_provider* data_prd,
                void* stream_user_data),
               (session, pri_spec, nva, nvlen, data_prd, stream_user_data))
DDPRUN_FORWARD(int, nghttp2_submit_rst_stream,
               (nghttp2_session* session, uint8_t flags, int32_t stream_id, uint32_t error_code),
               (session, flags, stream_id, error_code))

// Errors.
DDPRUN_FORWARD(const char*, nghttp2_strerror, (int lib_error_code), (lib_error_code))
DDPRUN_FORWARD(const char*, nghttp2_http2_strerror, (uint32_t error_code), (error_code))

#endif  // DDPRUN_NGHTTP2_LINKED
