#include <gtest/gtest.h>

#include <string>

#include "platform/error.h"
#include "runtime/stop_strings.h"

namespace cb {
namespace {

TEST(StopStrings, NoneHoldNothingBack) {
  const StopStrings none({});
  const StopStrings::Cut c = none.cut("User: hello");
  EXPECT_EQ(c.visible, 11u);
  EXPECT_FALSE(c.stopped);
}

TEST(StopStrings, CutsBeforeTheEarliestStopString) {
  const StopStrings s({"\nUser:", "###"});
  StopStrings::Cut c = s.cut("The answer is 42.### more\nUser: x");
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.visible, 17u);  // "The answer is 42."
  c = s.cut("###");
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.visible, 0u);
}

// A tail that a stop string begins with is held back, the longest one over
// all strings; text that can no longer start one is shown.
TEST(StopStrings, HoldsBackWhatCouldStartOne) {
  const StopStrings s({"\nUser:", "##"});
  StopStrings::Cut c = s.cut("The answer\nUs");
  EXPECT_FALSE(c.stopped);
  EXPECT_EQ(c.visible, 10u);
  c = s.cut("Total: 5 #");
  EXPECT_FALSE(c.stopped);
  EXPECT_EQ(c.visible, 9u);
  c = s.cut("The answer\nUsed");  // "\nUsed" is not "\nUser:"
  EXPECT_FALSE(c.stopped);
  EXPECT_EQ(c.visible, 15u);
  c = s.cut("\n");
  EXPECT_EQ(c.visible, 0u);
}

TEST(StopStrings, RejectsAnEmptyString) {
  EXPECT_THROW(StopStrings({"ok", ""}), Error);
}

}  // namespace
}  // namespace cb
