#pragma once

// Whether the host tests run under ThreadSanitizer, which runs them about ten times slower:
// their threaded tests then make fewer operations.

namespace devmr_test {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool under_tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool under_tsan = true;
#else
inline constexpr bool under_tsan = false;
#endif
#else
inline constexpr bool under_tsan = false;
#endif

}  // namespace devmr_test
