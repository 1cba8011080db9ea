#include "platform/cancel.h"

namespace cb {
namespace {

thread_local const std::function<bool()>* current_check = nullptr;

}  // namespace

ScopedCancelCheck::ScopedCancelCheck(std::function<bool()> check)
    : check_(std::move(check)), enclosing_(current_check) {
  current_check = check_ ? &check_ : enclosing_;
}

ScopedCancelCheck::~ScopedCancelCheck() {
  current_check = enclosing_;
}

bool cancel_requested() {
  if (current_check == nullptr) return false;
  try {
    return (*current_check)();
  } catch (...) {
    return true;
  }
}

}  // namespace cb
