// SplitText (atoll/core/text.h): the one split of the flags that take lists (--syncer, --state,
// --etcd).
#include "atoll/core/text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace atl {
namespace {

using Pieces = std::vector<std::string>;

TEST(SplitText, KeepsEveryPieceEmptyOnesIncluded) {
  EXPECT_EQ(SplitText("a:1", ','), Pieces{"a:1"});
  EXPECT_EQ(SplitText("a:1,b:2", ','), (Pieces{"a:1", "b:2"}));
  EXPECT_EQ(SplitText("a,,b", ','), (Pieces{"a", "", "b"}));
  EXPECT_EQ(SplitText(",a,", ','), (Pieces{"", "a", ""}));
  EXPECT_EQ(SplitText("", ','), Pieces{""});
  EXPECT_EQ(SplitText("a|b,c", '|'), (Pieces{"a", "b,c"}));
}

}  // namespace
}  // namespace atl
