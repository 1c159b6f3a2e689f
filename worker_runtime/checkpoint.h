#pragma once
// Checkpoints for elastic restarts.
//
// Rank 0 saves model, optimizer, step, epoch, sampler state and any JSON the program adds; after a
// restart every rank loads the newest complete checkpoint, so the group resumes where it stopped.
//
// A save is atomic: the file is written under a temporary name in the same directory, fsync'ed,
// renamed to ckpt-<step>.ddpck and the directory fsync'ed. A crash at any moment leaves either the
// old set of checkpoints or the old set plus the new one, never a half-written file under a final
// name. A save that fails (disk full, file too large, I/O error) throws CheckpointError naming the
// file, removes its temporary file and leaves every earlier checkpoint untouched. After a
// successful save, checkpoints beyond the newest `keep` are deleted.
//
// saveInBackground() takes the step's values on the caller's thread (the model and optimizer
// serialized, about a third of a save's time) and leaves checksums, write, fsync, rename and
// retention to a writer thread, so the training goes on while the disk works; the file is the
// same as save()'s. At most one write is in flight: the next saveInBackground(), save() or
// flush() waits for it and throws its CheckpointError (loadLatest() waits and logs it), the
// destructor waits for it and logs the error.
//
// Several writers may share the directory (two jobs, or hosts on a shared filesystem): each
// temporary name carries host, pid and a random part and is created with O_EXCL | O_NOFOLLOW
// (a planted file or symlink is never followed nor truncated); a save removes only
// temporaries of writers that are gone (a pid of this host that no longer exists, or a file
// untouched for an hour), never one being written. Every save lands whole or throws; the
// newest complete checkpoint wins. Names that look like checkpoints but carry a step this
// version never writes (beyond int64) are ignored with a warning.
//
// File format (version 1): a fixed header (magic "DDPRUNCK", version, lengths and CRC-32s), a JSON
// document with the metadata (step, epoch, the sampler's global position and dataset size, the
// world size that wrote it, the program's `extra` JSON), then the torch::serialize archive (model under "model", optimizer
// under "optimizer"), then the end magic "DDPRUNCK-END". A file whose size, magic or checksums do not
// match is torn or damaged: loadLatest() skips it with a warning and takes the next newest; load()
// of that one file throws CheckpointError naming the file and what is wrong.
#include <filesystem>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "base/errors.h"
#include "worker_runtime/sampler.h"

namespace ddprun::runtime {

class Communicator;

// A checkpoint could not be written or read.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// A complete checkpoint that this program cannot resume from: it holds another model (a tensor
// of another shape), no optimizer state, or a format this version does not read. Retrying cannot
// help (see error_file.h: it is not retryable).
class IncompatibleCheckpoint : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// Everything but the tensors.
struct TrainingState {
  int64_t step = 0;
  int64_t epoch = 0;
  SamplerState sampler;  // the position of all ranks together: resumable at any world size
  int worldSize = 0;     // the world size that wrote it (0: unknown); for logs
  nlohmann::json extra = nlohmann::json::object();  // the program's own values (best accuracy...)
};

struct CheckpointOptions {
  std::filesystem::path directory;
  int keep = 2;  // complete checkpoints kept after a save (>= 1)
};

class CheckpointManager {
 public:
  // Creates the directory when missing (CheckpointError when it cannot).
  explicit CheckpointManager(CheckpointOptions options);
  // Waits for a write in flight (see flush()); its error is logged, not thrown.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Writes ckpt-<state.step>.ddpck atomically (see above) and returns its path. Call on one rank
  // only (rank 0). A checkpoint of the same step is replaced atomically. A background write in
  // flight lands first; its error is thrown here, and this checkpoint is not written.
  std::filesystem::path save(const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                             const TrainingState& state);

  // The same checkpoint as save(), written on a writer thread: model and optimizer are
  // serialized before this returns, so the caller may change them at once. First waits for the
  // previous background write and throws its CheckpointError (that checkpoint was not written;
  // every earlier one is intact), then serialization errors as save() does.
  void saveInBackground(const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                        const TrainingState& state);

  // Waits for the background write in flight and returns its file (nullopt when none was in
  // flight); throws its CheckpointError, once. loadLatest() and list() see that file after this.
  std::optional<std::filesystem::path> flush();

  // Loads the newest complete checkpoint into model and optimizer (optimizer may be null) and
  // returns its state; nullopt when there is none (a fresh start). Torn or damaged files are
  // skipped with a warning. With `comm`, rank 0 chooses the checkpoint and broadcasts its step, and
  // every rank loads that one (they must all see the directory); a rank that cannot is an error.
  std::optional<TrainingState> loadLatest(torch::nn::Module& model,
                                          torch::optim::Optimizer* optimizer,
                                          Communicator* comm = nullptr);

  // Loads one file; CheckpointError naming the file and the defect when it is not a complete
  // checkpoint.
  static TrainingState load(const std::filesystem::path& file, torch::nn::Module& model,
                            torch::optim::Optimizer* optimizer);

  // Complete-looking checkpoints (by name), newest step first. Cheap: headers are not read.
  std::vector<std::filesystem::path> list() const;
  // Reads only the header and metadata; CheckpointError when the file is not a complete checkpoint.
  static TrainingState inspect(const std::filesystem::path& file);

  const CheckpointOptions& options() const { return options_; }

  // Serializes model and optimizer as save() does, into memory, and drops the result: nothing is
  // written. A hot spare's warm-up calls it with its throwaway model, so that a replacement's
  // first save (at its first checkpoint step, which the group waits for) does not run
  // serialization code for the first time nor fault in a fresh buffer page by page: the freed
  // buffers stay in the heap (malloc_tuning.h) for the real one. Returns the archive's bytes.
  static size_t rehearseSave(const torch::nn::Module& model,
                             const torch::optim::Optimizer* optimizer);

 private:
  // A checkpoint serialized and not yet written: the metadata and the torch archive.
  struct Serialized {
    int64_t step = 0;
    std::string meta;
    std::string payload;
  };
  // `reserve`: the archive's expected size (the last one's), so that its buffer is not regrown.
  static Serialized serialize(const torch::nn::Module& model,
                              const torch::optim::Optimizer* optimizer, const TrainingState& state,
                              size_t reserve);
  // Checksums, write, fsync, rename, retention. Touches no torch object: runs on any thread.
  std::filesystem::path write(const Serialized& s) const;

  CheckpointOptions options_;
  size_t lastPayloadBytes_ = 0;                  // reserved for the next archive
  std::future<std::filesystem::path> pending_;  // the background write in flight, if valid()
};

}  // namespace ddprun::runtime
