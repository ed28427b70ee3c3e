// Which sanitizer a test is built under, for the tests that must skip or adapt there: gcc
// defines __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__, clang answers __has_feature instead.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define KILN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define KILN_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_TEST_TSAN 1
#endif
#endif
