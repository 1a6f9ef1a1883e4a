/*
 * clock.h - monotonic time for measurements and deadlines.
 *
 * One definition of "now" for the whole program (the engine's latency histograms, the
 * server's idle waits, the backends' host-side timing), so every duration it reports is taken
 * on the same clock. CLOCK_MONOTONIC: never jumps when the wall clock is set.
 */
#ifndef GPTOSS_UTIL_CLOCK_H
#define GPTOSS_UTIL_CLOCK_H

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds since an arbitrary fixed point (monotonic; only differences mean anything). */
double gptoss_now_seconds(void);

/* The same clock in milliseconds. */
double gptoss_now_ms(void);

#ifdef __cplusplus
}
#endif

#endif
