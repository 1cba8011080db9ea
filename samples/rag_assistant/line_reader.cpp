#include "line_reader.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#if CB_HAVE_LIBEDIT
#include <histedit.h>

#include <clocale>
#endif

namespace rag {

#if CB_HAVE_LIBEDIT
// libedit's own read retries once after EINTR and its signal handling
// passes Ctrl-C on to the whole process group; reading here instead, a
// Ctrl-C at the prompt ends the line (EOF) and libedit restores the
// terminal on its way out.  Input is UTF-8: a character's bytes are read
// and decoded here (libedit wants one wchar_t per call).
struct LineReader::Editor {
  EditLine* el = nullptr;
  History* hist = nullptr;
  volatile std::sig_atomic_t* interrupted = nullptr;

  static Editor* of(EditLine* el) {
    void* self = nullptr;
    el_get(el, EL_CLIENTDATA, &self);
    return static_cast<Editor*>(self);
  }
  // 1 byte; 0 at EOF or Ctrl-C; -1 on an error.  Waits in slices of
  // 100 ms: a Ctrl-C that lands just before the wait is seen at the next.
  int byte(unsigned char* b) {
    for (;;) {
      if (*interrupted) return 0;
      pollfd p{STDIN_FILENO, POLLIN, 0};
      const int ready = ::poll(&p, 1, 100);
      if (ready < 0 && errno != EINTR) return -1;
      if (ready <= 0) continue;
      const ssize_t n = ::read(STDIN_FILENO, b, 1);
      if (n == 1) return 1;
      if (n == 0) return 0;
      if (errno != EINTR) return -1;
    }
  }
  static int getc(EditLine* el, wchar_t* out) {
    Editor* ed = of(el);
    unsigned char b = 0;
    int r = ed->byte(&b);
    if (r <= 0) return r;
    const int more = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
    uint32_t cp = more == 0 ? b : b & (0x3F >> more);
    for (int i = 0; i < more; ++i) {
      r = ed->byte(&b);
      if (r <= 0) return r;
      if ((b & 0xC0) != 0x80) break;  // malformed: keep what was read
      cp = (cp << 6) | (b & 0x3F);
    }
    *out = static_cast<wchar_t>(cp);
    return 1;
  }
  static const char* prompt(EditLine*) { return "> "; }
};
#else
struct LineReader::Editor {};
#endif

LineReader::LineReader(volatile std::sig_atomic_t* interrupted)
    : tty_(::isatty(STDIN_FILENO) != 0), interrupted_(interrupted) {
#if CB_HAVE_LIBEDIT
  if (!tty_) return;
  std::setlocale(LC_CTYPE, "");  // libedit converts lines with the locale
  auto ed = std::make_unique<Editor>();
  ed->interrupted = interrupted;
  ed->el = el_init("rag_assistant", stdin, stderr, stderr);
  ed->hist = history_init();
  if (ed->el == nullptr || ed->hist == nullptr) {
    if (ed->el) el_end(ed->el);
    if (ed->hist) history_end(ed->hist);
    return;  // plain lines then
  }
  HistEvent ev;
  history(ed->hist, &ev, H_SETSIZE, 200);
  history(ed->hist, &ev, H_SETUNIQUE, 1);
  el_set(ed->el, EL_CLIENTDATA, ed.get());
  el_set(ed->el, EL_EDITOR, "emacs");
  el_set(ed->el, EL_PROMPT, &Editor::prompt);
  el_set(ed->el, EL_HIST, history, ed->hist);
  el_set(ed->el, EL_GETCFN, &Editor::getc);
  el_source(ed->el, nullptr);  // the user's ~/.editrc, if any
  editor_ = std::move(ed);
#endif
}

LineReader::~LineReader() {
#if CB_HAVE_LIBEDIT
  if (editor_) {
    el_end(editor_->el);
    history_end(editor_->hist);
  }
#endif
}

bool LineReader::read(std::string& line) {
#if CB_HAVE_LIBEDIT
  if (editor_) {
    std::fputc('\n', stderr);
    int count = 0;
    const char* got = el_gets(editor_->el, &count);
    if (got == nullptr || count <= 0 || *interrupted_) return false;
    line.assign(got, static_cast<size_t>(count));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) {
      HistEvent ev;
      history(editor_->hist, &ev, H_ENTER, line.c_str());
    }
    return true;
  }
#endif
  if (tty_) {
    std::fputs("\n> ", stderr);
    std::fflush(stderr);
  }
  char* buf = nullptr;
  size_t cap = 0;
  errno = 0;
  const ssize_t n = ::getline(&buf, &cap, stdin);
  std::unique_ptr<char, decltype(&std::free)> hold(buf, &std::free);
  if (n < 0) return false;
  line.assign(buf, static_cast<size_t>(n));
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return true;
}

}  // namespace rag
