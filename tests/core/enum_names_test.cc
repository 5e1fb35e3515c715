// EnumNames: the one table of an enum's spellings behind its Name/Parse pair.
#include "atoll/core/enum_names.h"

#include <gtest/gtest.h>

namespace atl {
namespace {

enum class Colour { kRed, kGreen, kBlue };
constexpr EnumNames<Colour, 4> kColourNames{
    "colour", {{{Colour::kRed, "red"}, {Colour::kGreen, "green"}, {Colour::kGreen, "verde"}, {Colour::kBlue, "blue"}}}};

TEST(EnumNames, NameIsTheFirstSpellingAndParseAcceptsEvery) {
  EXPECT_STREQ(kColourNames.Name(Colour::kRed), "red");
  EXPECT_STREQ(kColourNames.Name(Colour::kGreen), "green");
  EXPECT_STREQ(kColourNames.Name(static_cast<Colour>(7)), "?");
  for (Colour c : {Colour::kRed, Colour::kGreen, Colour::kBlue})
    EXPECT_EQ(*kColourNames.Parse(kColourNames.Name(c)), c);
  EXPECT_EQ(*kColourNames.Parse("verde"), Colour::kGreen);  // an older spelling still reads
  static_assert(kColourNames.Name(Colour::kBlue)[0] == 'b', "Name is usable at compile time");
}

TEST(EnumNames, AnythingElseIsInvalidArgumentListingTheSpellings) {
  const auto bad = kColourNames.Parse("Red");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "colour must be red, green or blue (got 'Red')");
  EXPECT_FALSE(kColourNames.Parse("").ok());
  // A peer's string is cut in the message.
  const auto long_bad = kColourNames.Parse(std::string(200, 'x'));
  EXPECT_EQ(long_bad.status().message(), "colour must be red, green or blue (got '" + std::string(32, 'x') + "')");
  EXPECT_EQ(kColourNames.Alternatives(" | ", " | "), "red | green | blue");
}

}  // namespace
}  // namespace atl
