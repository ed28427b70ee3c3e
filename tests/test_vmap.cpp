#include <gtest/gtest.h>
TEST(Vmap, Stub) {}
