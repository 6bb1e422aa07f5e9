// Identities of data and tokenizers (issue 42, classes 4-5): FNV-1a 64 checksums, sampled
// checksums of large files, and the tokenizer fingerprint stored in dataset sidecars, checkpoints
// and exports. No dependencies beyond core/error.h (the fuzz targets compile this file alone).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moe::io {

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);
std::string hex16(uint64_t v);  // 16 lowercase hex digits
// 64-bit FNV-1a of 256 blocks of 4 KiB spread evenly over the first `size` bytes of fd, and of
// its last block (the whole file when it is at most 4 MiB), then of the size; folded into `h`.
// Errors name path.
uint64_t sampled_fnv1a64(int fd, uint64_t size, const std::string& path, uint64_t h = 0xcbf29ce484222325ull);
uint64_t sampled_fnv1a64(const uint8_t* data, uint64_t size);  // the same blocks of bytes in memory

// FNV-1a 64 of "moetrain tokenizer\n<kind>\n<vocab>\n" and the model file's bytes (none for bytes).
std::string tokenizer_fingerprint(const std::string& kind, int vocab_size, std::string_view model_bytes);
std::string byte_tokenizer_fingerprint();  // bytes, 256
// "<bytes|spm>-<vocab>-<16 lowercase hex>".
bool is_tokenizer_fingerprint(const std::string& s);
// The tokenizer a model was trained with (model_fp, from model_source) against the one it is
// given now (data_fp, from data_source): different fingerprints throw moe::Error naming both;
// when exactly one is "" (a file from before fingerprints) returns a one-line note for the caller
// to print; "" when they match or neither is known.
std::string check_tokenizer_match(const std::string& model_fp, const std::string& model_source,
                                  const std::string& data_fp, const std::string& data_source);
}  // namespace moe::io
