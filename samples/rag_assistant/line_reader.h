// The chat's input: one question per line.  At a terminal, with line
// editing (arrow keys, Home/End, word moves) and history of this session
// where the build has libedit; otherwise (a pipe, a file, no libedit) plain
// lines from stdin.
#pragma once

#include <csignal>
#include <memory>
#include <string>

namespace rag {

class LineReader {
 public:
  // `interrupted`: set by the caller's SIGINT handler (installed without
  // SA_RESTART); a Ctrl-C at the prompt ends the input.
  explicit LineReader(volatile std::sig_atomic_t* interrupted);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  bool at_terminal() const { return tty_; }
  // The next line, without its line end.  false: end of input, or Ctrl-C at
  // the prompt.
  bool read(std::string& line);

 private:
  struct Editor;  // libedit's state, when used
  bool tty_;
  volatile std::sig_atomic_t* interrupted_;
  std::unique_ptr<Editor> editor_;
};

}  // namespace rag
