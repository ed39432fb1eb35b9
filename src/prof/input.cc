// Byte sources for the trace reader: raw or gzip, from a file or from memory.
#include "prof/input.h"

#include <zlib.h>

#include "molora/settings.h"
#ifdef MOLORA_PROF_ISAL
#include <isa-l/igzip_lib.h>
#endif

#include <cerrno>
#include <cstring>
#include <vector>

namespace molora::prof::detail {
namespace {

// Compressed/raw bytes from a file or from memory.
class Bytes {
 public:
  virtual ~Bytes() = default;
  // Returns a view of the next bytes (len 0 at the end); valid until the next call.
  virtual Status next(const unsigned char** p, size_t* len) = 0;
  virtual uint64_t total() const = 0;
  uint64_t consumed = 0;
};

class FileBytes : public Bytes {
 public:
  FileBytes(FILE* f, std::string path, uint64_t size)
      : f_(f), path_(std::move(path)), size_(size), buf_(4u << 20) {}
  ~FileBytes() override { std::fclose(f_); }
  Status next(const unsigned char** p, size_t* len) override {
    size_t n = std::fread(buf_.data(), 1, buf_.size(), f_);
    if (n == 0 && std::ferror(f_))
      return Status::IoError(path_ + ": read failed: " + std::strerror(errno));
    consumed += n;
    *p = buf_.data();
    *len = n;
    return Status::Ok();
  }
  uint64_t total() const override { return size_; }
  // Reads straight into dst (raw JSON: no copy through buf_).
  Status read_into(char* dst, size_t cap, size_t* got) {
    size_t n = std::fread(dst, 1, cap, f_);
    if (n == 0 && std::ferror(f_))
      return Status::IoError(path_ + ": read failed: " + std::strerror(errno));
    consumed += n;
    *got = n;
    return Status::Ok();
  }

 private:
  FILE* f_;
  std::string path_;
  uint64_t size_;
  std::vector<unsigned char> buf_;
};

class MemBytes : public Bytes {
 public:
  MemBytes(const void* d, size_t n) : d_(static_cast<const unsigned char*>(d)), n_(n) {}
  Status next(const unsigned char** p, size_t* len) override {
    size_t k = std::min<size_t>(n_ - consumed, 16u << 20);
    *p = d_ + consumed;
    *len = k;
    consumed += k;
    return Status::Ok();
  }
  uint64_t total() const override { return n_; }

 private:
  const unsigned char* d_;
  size_t n_;
};

class RawInput : public Input {
 public:
  explicit RawInput(std::unique_ptr<Bytes> b, const unsigned char* head, size_t head_len)
      : b_(std::move(b)), head_(head, head + head_len) {}
  Status read(char* dst, size_t cap, size_t* got) override {
    *got = 0;
    if (hpos_ < head_.size()) {
      size_t k = std::min(cap, head_.size() - hpos_);
      std::memcpy(dst, head_.data() + hpos_, k);
      hpos_ += k;
      *got = k;
      return Status::Ok();
    }
    if (auto* fb = dynamic_cast<FileBytes*>(b_.get())) return fb->read_into(dst, cap, got);
    while (plen_ == 0) {
      MOLORA_RETURN_IF_ERROR(b_->next(&p_, &plen_));
      if (plen_ == 0) return Status::Ok();
    }
    size_t k = std::min(cap, plen_);
    std::memcpy(dst, p_, k);
    p_ += k;
    plen_ -= k;
    *got = k;
    return Status::Ok();
  }
  uint64_t consumed() const override { return b_->consumed; }
  uint64_t total() const override { return b_->total(); }

 private:
  std::unique_ptr<Bytes> b_;
  std::vector<unsigned char> head_;
  size_t hpos_ = 0;
  const unsigned char* p_ = nullptr;
  size_t plen_ = 0;
};

// gzip input (members back to back, zero padding between them skipped) over an inflater
// engine: zlib, or ISA-L's igzip when built with it. The engine holds the input/output windows
// and offers reset() (a new member, windows kept) and step() (one inflate call).
enum class Step { kOk, kMemberEnd, kError };

class ZlibEngine {
 public:
  ZlibEngine() { inflateInit2(&z_, 15 + 32); }  // gzip or zlib header, detected
  ~ZlibEngine() { inflateEnd(&z_); }
  ZlibEngine(const ZlibEngine&) = delete;
  ZlibEngine& operator=(const ZlibEngine&) = delete;
  void set_in(const unsigned char* p, size_t n) {
    z_.next_in = const_cast<Bytef*>(p);
    z_.avail_in = static_cast<uInt>(n);
  }
  void set_out(char* p, size_t n) {
    z_.next_out = reinterpret_cast<Bytef*>(p);
    z_.avail_out = static_cast<uInt>(n);
  }
  const unsigned char* next_in() const { return z_.next_in; }
  size_t avail_in() const { return z_.avail_in; }
  char* next_out() const { return reinterpret_cast<char*>(z_.next_out); }
  size_t avail_out() const { return z_.avail_out; }
  void reset() { inflateReset(&z_); }
  Step step(std::string* err) {
    int rc = inflate(&z_, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) return Step::kMemberEnd;
    if (rc == Z_OK || rc == Z_BUF_ERROR) return Step::kOk;  // Z_BUF_ERROR: no progress possible
    *err = z_.msg ? z_.msg : "inflate failed";
    return Step::kError;
  }

 private:
  z_stream z_{};
};

#ifdef MOLORA_PROF_ISAL
// igzip: gzip header and trailer with CRC checked.
class IsalEngine {
 public:
  IsalEngine() { init(); }
  void set_in(const unsigned char* p, size_t n) {
    s_.next_in = const_cast<uint8_t*>(p);
    s_.avail_in = static_cast<uint32_t>(n);
  }
  void set_out(char* p, size_t n) {
    s_.next_out = reinterpret_cast<uint8_t*>(p);
    s_.avail_out = static_cast<uint32_t>(n);
  }
  const unsigned char* next_in() const { return s_.next_in; }
  size_t avail_in() const { return s_.avail_in; }
  char* next_out() const { return reinterpret_cast<char*>(s_.next_out); }
  size_t avail_out() const { return s_.avail_out; }
  void reset() {  // isal_inflate_init clears the windows too
    const unsigned char* in = next_in();
    size_t n_in = avail_in(), n_out = avail_out();
    char* out = next_out();
    init();
    set_in(in, n_in);
    set_out(out, n_out);
  }
  Step step(std::string* err) {
    // igzip ignores the reserved bits of the header's FLG byte (member byte 3), which RFC 1952
    // says a decompressor must reject and zlib does: checked here, with zlib's message, so
    // both inflaters give one verdict (a fuzzer case).
    if (member_pos_ <= 3 && member_pos_ + avail_in() > 3 &&
        (next_in()[3 - member_pos_] & 0xe0) != 0) {
      *err = "unknown header flags set";
      return Step::kError;
    }
    const size_t in_before = avail_in();
    int rc = isal_inflate(&s_);
    member_pos_ += in_before - avail_in();
    if (rc < 0 || rc == ISAL_NAME_OVERFLOW || rc == ISAL_COMMENT_OVERFLOW ||
        rc == ISAL_EXTRA_OVERFLOW || rc == ISAL_NEED_DICT) {
      *err = message(rc);
      return Step::kError;
    }
    return s_.block_state == ISAL_BLOCK_FINISH ? Step::kMemberEnd : Step::kOk;
  }

 private:
  void init() {
    isal_inflate_init(&s_);
    s_.crc_flag = ISAL_GZIP;  // parse the gzip header and trailer, check the CRC
    member_pos_ = 0;
  }
  static const char* message(int rc) {
    switch (rc) {
      case ISAL_INVALID_BLOCK:
        return "invalid deflate block";
      case ISAL_INVALID_SYMBOL:
        return "invalid deflate symbol";
      case ISAL_INVALID_LOOKBACK:
        return "invalid distance";
      case ISAL_INVALID_WRAPPER:
        return "invalid gzip header";
      case ISAL_UNSUPPORTED_METHOD:
        return "unsupported compression method";
      case ISAL_INCORRECT_CHECKSUM:
        return "incorrect checksum";
      case ISAL_NEED_DICT:
        return "needs a preset dictionary";
      default:
        return "inflate failed";
    }
  }
  inflate_state s_;
  uint64_t member_pos_ = 0;  // bytes of the current member consumed
};
#endif

template <class Engine>
class GzInput : public Input {
 public:
  GzInput(std::unique_ptr<Bytes> b, const unsigned char* head, size_t head_len)
      : b_(std::move(b)), head_(head, head + head_len) {
    e_.set_in(head_.data(), head_.size());
  }
  Status read(char* dst, size_t cap, size_t* got) override {
    *got = 0;
    if (done_) return Status::Ok();
    e_.set_out(dst, std::min<size_t>(cap, 1u << 30));
    while (e_.avail_out() > 0) {
      if (e_.avail_in() == 0 && !eof_in_) {
        const unsigned char* p = nullptr;
        size_t n = 0;
        MOLORA_RETURN_IF_ERROR(b_->next(&p, &n));
        if (n == 0)
          eof_in_ = true;
        else
          e_.set_in(p, n);
      }
      if (member_end_) {  // another gzip member follows? (skip trailing zero padding)
        const unsigned char* p = e_.next_in();
        size_t n = e_.avail_in();
        while (n > 0 && *p == 0) ++p, --n;
        e_.set_in(p, n);
        if (n == 0) {
          if (!eof_in_) continue;
          done_ = true;
          break;
        }
        e_.reset();
        member_end_ = false;
      }
      // An inflater may hold input (or output) back: with no new input it is called again
      // until it gives nothing more; then, at the end of the input and before the member's
      // trailer, the stream is truncated.
      const size_t room_before = e_.avail_out();
      std::string err;
      Step st = e_.step(&err);
      if (st == Step::kError) {
        const uint64_t at = b_->consumed - e_.avail_in();
        // zlib checks a member's CRC as soon as its 4 bytes are in; igzip waits for the whole
        // 8-byte trailer. An input that ends inside the trailer is truncated, whatever its CRC
        // says, so that both inflaters give one verdict (a fuzzer case).
        if (err == "incorrect data check" && b_->total() > 0 && b_->total() - at < 4) {
          truncated = true;
          warning = "gzip stream ends inside its trailer (file truncated)";
          done_ = true;
          break;
        }
        return Status::ParseError("gzip data error near compressed byte " + std::to_string(at) +
                                  ": " + err);
      }
      if (st == Step::kMemberEnd) {
        member_end_ = true;
      } else if (eof_in_ && e_.avail_in() == 0 && e_.avail_out() == room_before) {
        truncated = true;
        warning = "gzip stream ends before its trailer (file truncated)";
        done_ = true;
        break;
      }
    }
    *got = static_cast<size_t>(e_.next_out() - dst);
    return Status::Ok();
  }
  uint64_t consumed() const override { return b_->consumed - e_.avail_in(); }
  uint64_t total() const override { return b_->total(); }

 private:
  std::unique_ptr<Bytes> b_;
  std::vector<unsigned char> head_;
  Engine e_;
  bool member_end_ = false, done_ = false, eof_in_ = false;
};

std::unique_ptr<Input> wrap(std::unique_ptr<Bytes> b, const unsigned char* head, size_t n) {
  if (n >= 2 && head[0] == 0x1f && head[1] == 0x8b) {
#ifdef MOLORA_PROF_ISAL
    if (get_setting("MOLORA_PROF_GZIP") != "zlib")  // zlib stays reachable (tests, comparison)
      return std::make_unique<GzInput<IsalEngine>>(std::move(b), head, n);
#endif
    return std::make_unique<GzInput<ZlibEngine>>(std::move(b), head, n);
  }
  return std::make_unique<RawInput>(std::move(b), head, n);
}

}  // namespace

Status open_file(const std::string& path, std::unique_ptr<Input>* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::IoError(path + ": cannot open: " + std::strerror(errno));
  uint64_t size = 0;
  if (std::fseek(f, 0, SEEK_END) == 0) {
    long s = std::ftell(f);
    if (s > 0) size = static_cast<uint64_t>(s);
    std::fseek(f, 0, SEEK_SET);
  }
  unsigned char head[2];
  size_t n = std::fread(head, 1, 2, f);
  auto b = std::make_unique<FileBytes>(f, path, size);
  b->consumed = n;
  *out = wrap(std::move(b), head, n);
  return Status::Ok();
}

std::unique_ptr<Input> open_memory(const void* data, size_t size) {
  auto b = std::make_unique<MemBytes>(data, size);
  const unsigned char* p = nullptr;
  size_t n = 0;
  b->next(&p, &n);  // memory never fails
  // The first chunk is the "head"; the rest follows from b.
  return wrap(std::move(b), p, n);
}

}  // namespace molora::prof::detail
