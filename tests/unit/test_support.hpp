// Small helpers shared by the unit tests: a private temporary directory and a stderr capture.
#pragma once

#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"

namespace attnjit::testing {

// Whether the long sweeps run in full: ATTNJIT_TEST_SWEEP=1, which the ctest entries labelled
// "sweep" set (tests/run.sh --sweep). Otherwise a sweep runs the part of it that fits CI's time
// and still covers what each test names (every example, every candidate tile, every pair of
// parameters, a random sweep).
inline bool full_sweep() { return env_flag("ATTNJIT_TEST_SWEEP", false); }

// The message of the UserError `f` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

// A fresh directory per test case, removed afterwards (write permission restored first), so
// tests can run in parallel.
struct TempDir {
  std::string path;
  TempDir() {
    char pattern[] = "/tmp/attnjit-test-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    ::chmod(path.c_str(), 0755);
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// Captures what is written to stderr (fd 2) between construction and text().
class StderrCapture {
public:
  StderrCapture() : file_(std::tmpfile()) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(::fileno(file_), 2);
  }
  ~StderrCapture() {
    restore();
    std::fclose(file_);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    for (int c; (c = std::fgetc(file_)) != EOF;) out += static_cast<char>(c);
    return out;
  }

private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_ = -1;
};

// Forks `children` processes that all start `body(child)` at the same moment (released together
// through a pipe) and requires each to exit 0. A child reports only through its exit status
// (body's return value; 4 if it throws), never returning into Catch.
inline void run_processes_at_once(int children, const std::function<int(int)>& body) {
  int go[2];
  REQUIRE(::pipe(go) == 0);
  std::vector<pid_t> pids;
  for (int c = 0; c < children; ++c) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int status = 0;
      try {
        ::close(go[1]);
        char byte;
        if (::read(go[0], &byte, 1) != 0) status = 9;  // EOF once the parent closes: all start together
        if (status == 0) status = body(c);
      } catch (...) {
        status = 4;
      }
      ::_exit(status);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

}  // namespace attnjit::testing
