// Progress (common/progress.h): plain sparse lines into a file or pipe, a redrawn line on a
// terminal (a pseudo-terminal here), nothing when disabled.
#include "common/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace moestream {
namespace {

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

size_t count(const std::string& s, char c) { return size_t(std::count(s.begin(), s.end(), c)); }

TEST(Progress, IntoAFileShowsTheFirstAndLastLinesOnlyWithoutCarriageReturns) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("job", true, f, {.redraw_s = 0.1, .line_s = 3600});
    EXPECT_FALSE(p.terminal());
    for (uint64_t i = 0; i <= 1000; ++i) p.update(i, 1000, "item " + std::to_string(i));
    p.update(1000, 1000, "again");  // after the last: ignored
  }
  const std::string out = read_all(f);
  std::fclose(f);
  EXPECT_EQ(out, "job: 0% item 0\njob: 100% item 1000\n");
}

TEST(Progress, IntoAFileWithoutAnIntervalEveryUpdateIsALine) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("job", true, f, {.redraw_s = 0, .line_s = 0});
    for (uint64_t i = 1; i <= 4; ++i) p.update(i, 4);
  }
  const std::string out = read_all(f);
  std::fclose(f);
  EXPECT_EQ(count(out, '\n'), 4u) << out;
  EXPECT_EQ(count(out, '\r'), 0u) << out;
  EXPECT_NE(out.find("job: 50%\n"), std::string::npos) << out;
}

TEST(Progress, DisabledPrintsNothingAndAZeroTotalIsComplete) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress off("job", false, f);
    off.update(0, 10);
    off.update(10, 10);
  }
  EXPECT_EQ(read_all(f), "");
  {
    Progress p("empty", true, f);
    p.update(0, 0);
  }
  EXPECT_EQ(read_all(f), "empty: 100%\n");
  std::fclose(f);
}

TEST(Progress, BriefIntoAFileAShortJobPrintsNothingALongOneItsLinesAndTheLast) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("job", true, f, {.redraw_s = 0.1, .line_s = 3600, .brief = true});
    for (uint64_t i = 1; i <= 10; ++i) p.update(i, 10);
  }
  EXPECT_EQ(read_all(f), "");
  {
    Progress p("job", true, f, {.redraw_s = 0, .line_s = 0, .brief = true});
    for (uint64_t i = 1; i <= 4; ++i) p.update(i, 4);  // the first only starts the clock
  }
  const std::string out = read_all(f);
  std::fclose(f);
  EXPECT_EQ(out, "job: 50%\njob: 75%\njob: 100%\n");
}

TEST(Progress, OnATerminalOneLineIsRedrawnAndEndedByANewline) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0)
    GTEST_SKIP() << "no pseudo-terminal available";
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  std::FILE* tty = ::fdopen(slave, "w");
  ASSERT_NE(tty, nullptr);
  {
    Progress p("job", true, tty, {.redraw_s = 0, .line_s = 3600});
    EXPECT_TRUE(p.terminal());
    p.update(1, 4, "a longer detail");
    p.update(2, 4, "b");
  }  // left open: the destructor ends the line
  std::fclose(tty);
  std::string out;
  char buf[4096];
  ssize_t n;
  const int flags = ::fcntl(master, F_GETFL);
  ::fcntl(master, F_SETFL, flags | O_NONBLOCK);
  while ((n = ::read(master, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  ::close(master);
  EXPECT_EQ(count(out, '\r'), 2u + 1u) << out;  // two redraws; the tty turns the final '\n' into "\r\n"
  EXPECT_NE(out.find("job [#######.......................] 25% a longer detail"), std::string::npos) << out;
  EXPECT_NE(out.find("job [###############...............] 50% b              "), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - 2), "\r\n") << out;
}

}  // namespace
}  // namespace moestream
