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

class GzInput : public Input {
 public:
  GzInput(std::unique_ptr<Bytes> b, const unsigned char* head, size_t head_len)
      : b_(std::move(b)), head_(head, head + head_len) {
    std::memset(&z_, 0, sizeof(z_));
    inflateInit2(&z_, 15 + 32);  // gzip or zlib header, detected
    z_.next_in = head_.data();
    z_.avail_in = static_cast<uInt>(head_.size());
  }
  ~GzInput() override { inflateEnd(&z_); }
  Status read(char* dst, size_t cap, size_t* got) override {
    *got = 0;
    if (done_) return Status::Ok();
    z_.next_out = reinterpret_cast<Bytef*>(dst);
    z_.avail_out = static_cast<uInt>(std::min<size_t>(cap, 1u << 30));
    while (z_.avail_out > 0) {
      if (z_.avail_in == 0) {
        const unsigned char* p = nullptr;
        size_t n = 0;
        MOLORA_RETURN_IF_ERROR(b_->next(&p, &n));
        if (n == 0) {
          if (!member_end_) {
            truncated = true;
            warning = "gzip stream ends before its trailer (file truncated)";
          }
          done_ = true;
          break;
        }
        z_.next_in = const_cast<Bytef*>(p);
        z_.avail_in = static_cast<uInt>(n);
      }
      if (member_end_) {  // another gzip member follows? (skip trailing zero padding)
        while (z_.avail_in > 0 && *z_.next_in == 0) {
          ++z_.next_in;
          --z_.avail_in;
        }
        if (z_.avail_in == 0) continue;
        inflateReset(&z_);
        member_end_ = false;
      }
      int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        member_end_ = true;
      } else if (rc == Z_BUF_ERROR) {
        continue;  // needs more input
      } else if (rc != Z_OK) {
        return Status::ParseError(std::string("gzip data error near compressed byte ") +
                                  std::to_string(b_->consumed - z_.avail_in) + ": " +
                                  (z_.msg ? z_.msg : "inflate failed"));
      }
    }
    *got = static_cast<size_t>(reinterpret_cast<char*>(z_.next_out) - dst);
    return Status::Ok();
  }
  uint64_t consumed() const override { return b_->consumed - z_.avail_in; }
  uint64_t total() const override { return b_->total(); }

 private:
  std::unique_ptr<Bytes> b_;
  std::vector<unsigned char> head_;
  z_stream z_;
  bool member_end_ = false, done_ = false;
};

#ifdef MOLORA_PROF_ISAL
// The same contract through ISA-L's igzip (gzip header and trailer with CRC checked, members
// back to back, zero padding between them skipped). Used for gzip-magic input; zlib input
// (0x78 ..) has no such magic and never gets here.
class IsalGzInput : public Input {
 public:
  IsalGzInput(std::unique_ptr<Bytes> b, const unsigned char* head, size_t head_len)
      : b_(std::move(b)), head_(head, head + head_len) {
    reset();
    s_.next_in = head_.data();
    s_.avail_in = static_cast<uint32_t>(head_.size());
  }
  Status read(char* dst, size_t cap, size_t* got) override {
    *got = 0;
    if (done_) return Status::Ok();
    s_.next_out = reinterpret_cast<uint8_t*>(dst);
    s_.avail_out = static_cast<uint32_t>(std::min<size_t>(cap, 1u << 30));
    while (s_.avail_out > 0) {
      if (s_.avail_in == 0 && !eof_in_) {
        const unsigned char* p = nullptr;
        size_t n = 0;
        MOLORA_RETURN_IF_ERROR(b_->next(&p, &n));
        if (n == 0) {
          eof_in_ = true;
        } else {
          s_.next_in = const_cast<uint8_t*>(p);
          s_.avail_in = static_cast<uint32_t>(n);
        }
      }
      if (member_end_) {  // another gzip member follows? (skip trailing zero padding)
        while (s_.avail_in > 0 && *s_.next_in == 0) {
          ++s_.next_in;
          --s_.avail_in;
        }
        if (s_.avail_in == 0) {
          if (eof_in_) {
            done_ = true;
            break;
          }
          continue;
        }
        uint8_t* out = s_.next_out;
        uint32_t room = s_.avail_out;
        uint8_t* in = s_.next_in;
        uint32_t avail = s_.avail_in;
        reset();
        s_.next_out = out, s_.avail_out = room, s_.next_in = in, s_.avail_in = avail;
        member_end_ = false;
      }
      // igzip takes input into its own buffer ahead of the output it can give: with no new
      // input it is called again until it gives nothing more (then, at the end of the input
      // and before the member's trailer, the stream is truncated).
      const uint32_t room_before = s_.avail_out;
      int rc = isal_inflate(&s_);
      if (rc < 0 || rc == ISAL_NAME_OVERFLOW || rc == ISAL_COMMENT_OVERFLOW ||
          rc == ISAL_EXTRA_OVERFLOW || rc == ISAL_NEED_DICT)
        return Status::ParseError(std::string("gzip data error near compressed byte ") +
                                  std::to_string(b_->consumed - s_.avail_in) + ": " +
                                  isal_error(rc));
      if (s_.block_state == ISAL_BLOCK_FINISH) {
        member_end_ = true;
      } else if (eof_in_ && s_.avail_in == 0 && s_.avail_out == room_before) {
        truncated = true;
        warning = "gzip stream ends before its trailer (file truncated)";
        done_ = true;
        break;
      }
    }
    *got = static_cast<size_t>(reinterpret_cast<char*>(s_.next_out) - dst);
    return Status::Ok();
  }
  uint64_t consumed() const override { return b_->consumed - s_.avail_in; }
  uint64_t total() const override { return b_->total(); }

 private:
  void reset() {
    isal_inflate_init(&s_);
    s_.crc_flag = ISAL_GZIP;  // parse the gzip header and trailer, check the CRC
  }
  static const char* isal_error(int rc) {
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
  std::unique_ptr<Bytes> b_;
  std::vector<unsigned char> head_;
  inflate_state s_;
  bool member_end_ = false, done_ = false, eof_in_ = false;
};
#endif

std::unique_ptr<Input> wrap(std::unique_ptr<Bytes> b, const unsigned char* head, size_t n) {
  if (n >= 2 && head[0] == 0x1f && head[1] == 0x8b) {
#ifdef MOLORA_PROF_ISAL
    if (get_setting("MOLORA_PROF_GZIP") != "zlib")  // zlib stays reachable (tests, comparison)
      return std::make_unique<IsalGzInput>(std::move(b), head, n);
#endif
    return std::make_unique<GzInput>(std::move(b), head, n);
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
