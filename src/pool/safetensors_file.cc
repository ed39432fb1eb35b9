// SafetensorsFile: read-only mmap of a file plus its validated header.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "molora/safetensors.h"

namespace molora {

Status SafetensorsFile::open(const std::string& path, std::unique_ptr<SafetensorsFile>* out) {
  out->reset();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::IoError(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IoError(path + ": not a regular file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Status::ParseError(path + ": file of " + std::to_string(size) +
                              " bytes is shorter than the 8-byte header length");
  }
  // First a plain mapping for the header: a refused file costs only the pages the parser read.
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    return Status::IoError(path + ": cannot mmap: " + std::strerror(e));
  }
  StHeader header;
  Status s = parse_safetensors(static_cast<const uint8_t*>(p), size, path, &header);
  ::munmap(p, size);
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  // Valid: the data is read once, in order. MAP_POPULATE fills the page tables from the page
  // cache in one pass (measured faster than faulting, and than MADV_POPULATE_READ, here).
  p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return Status::IoError(path + ": cannot mmap: " + std::strerror(e));
  ::madvise(p, size, MADV_SEQUENTIAL);
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->header_ = std::move(header);
  *out = std::move(f);
  return Status::Ok();
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

}  // namespace molora
