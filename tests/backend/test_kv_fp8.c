/*
 * test_kv_fp8.c - the FP8 KV cache format (src/backend/kv_fp8.h) against the e4m3 definition.
 *
 * The reference is written here from the format alone (OCP FP8 e4m3: 1 sign, 4 exponent bits
 * with bias 7, 3 mantissa bits, exponent 0 subnormal, S.1111.111 NaN, no infinity):
 *   - decode: the value of every one of the 256 codes, computed with ldexp in double;
 *   - encode: by brute force over that table: the nearest of the 127 non-negative finite
 *     values to |x| (ties to the code whose mantissa is even), magnitudes from 448 up
 *     saturated to 448, the sign copied; NaN (either sign) to 0x7f. The distances are computed in
 *     double, exact wherever two candidates are close to a tie (x has 24 significant bits and
 *     sits between two values within a factor of 2 of it, or next to 0).
 * Encode is checked on every bf16 bit pattern, on every value, midpoint and their float
 * neighbours, and on a million random floats; then the vector round trip (scale, codes,
 * decode * scale) for its error bound and its edge cases (zero vector, NaN, saturation).
 */
#include "test_support.h"

#include "backend/kv_fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double table[256]; /* value of every code from the definition; NaN for 0x7f, 0xff */

static void build_table(void) {
    for (int code = 0; code < 256; code++) {
        int e = (code >> 3) & 15, m = code & 7;
        double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp((double)m, -9);
        if ((code & 0x7f) == 0x7f) v = NAN;
        table[code] = (code & 0x80) ? -v : v;
    }
}

static uint8_t reference_encode(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return 0x7f;
    double a = fabs((double)x);
    if (a >= 448.0) return sign | 0x7e;
    int best = 0;
    for (int code = 1; code <= 0x7e; code++) {
        double d = fabs(a - table[code]), db = fabs(a - table[best]);
        if (d < db || (d == db && (code & 1) == 0 && (best & 1) == 1)) best = code;
    }
    return (uint8_t)(sign | best);
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int encode_mismatches;
static void check_encode(float x) {
    uint8_t got = gptoss_e4m3_encode(x), want = reference_encode(x);
    if (got != want && encode_mismatches++ < 10)
        print_error("encode(%a = %.9g) = 0x%02x, reference 0x%02x\n", (double)x, (double)x, got,
                    want);
}

/* Every code decodes to its defined value: same bits for numbers (so -0 stays -0), NaN for
 * the two NaN codes. */
static void test_decode_all_codes(void **state) {
    (void)state;
    for (int code = 0; code < 256; code++) {
        float got = gptoss_e4m3_decode((uint8_t)code);
        if (isnan(table[code])) {
            assert_true(isnan(got));
            continue;
        }
        float want = (float)table[code];
        if (memcmp(&got, &want, 4) != 0)
            fail_msg("decode(0x%02x) = %a, definition %a", code, (double)got, table[code]);
    }
    assert_true(gptoss_e4m3_decode(0x7e) == 448.0f);
    assert_true(gptoss_e4m3_decode(0x01) == ldexpf(1.0f, -9));
    assert_true(gptoss_e4m3_decode(0x08) == ldexpf(1.0f, -6));
    assert_true(signbit(gptoss_e4m3_decode(0x80)) && gptoss_e4m3_decode(0x80) == 0.0f);
}

/* Encoding each value gives its code back; the value's float neighbours and the midpoints
 * between values (ties: to the even code) and their neighbours round as the reference says. */
static void test_encode_values_and_midpoints(void **state) {
    (void)state;
    encode_mismatches = 0;
    for (int code = 0; code < 256; code++) {
        if ((code & 0x7f) == 0x7f) continue;
        float v = (float)table[code];
        assert_int_equal(gptoss_e4m3_encode(v), code);
        check_encode(nextafterf(v, INFINITY));
        check_encode(nextafterf(v, -INFINITY));
    }
    for (int code = 0; code < 0x7e; code++) {
        for (int sign = 0; sign < 2; sign++) {
            float mid = (float)((table[code] + table[code + 1]) / 2); /* exact: a few bits */
            if (sign) mid = -mid;
            check_encode(mid);
            check_encode(nextafterf(mid, INFINITY));
            check_encode(nextafterf(mid, -INFINITY));
            /* the tie goes to the even code, which is one of the two neighbours */
            uint8_t got = gptoss_e4m3_encode(mid) & 0x7f;
            assert_true((got == code || got == code + 1) && (got & 1) == 0);
        }
    }
    /* the documented examples: 1.0625 -> 1, 1.1875 -> 1.25, 17 -> 16, 19 -> 20, 232 -> 224,
     * 2^-10 -> 0, 3 * 2^-10 -> 2^-8, 2^-6 - 2^-10 -> 2^-6 */
    const float in[] = {1.0625f, 1.1875f,  17.0f,    19.0f,
                        232.0f,  0x1p-10f, 0x3p-10f, 0x1p-6f - 0x1p-10f};
    const float out[] = {1.0f, 1.25f, 16.0f, 20.0f, 224.0f, 0.0f, 0x1p-8f, 0x1p-6f};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        assert_true(gptoss_e4m3_decode(gptoss_e4m3_encode(in[i])) == out[i]);
        assert_true(gptoss_e4m3_decode(gptoss_e4m3_encode(-in[i])) == -out[i]);
    }
    assert_int_equal(encode_mismatches, 0);
}

/* Saturation, infinities, NaN and signed zeros. */
static void test_encode_edges(void **state) {
    (void)state;
    assert_int_equal(gptoss_e4m3_encode(448.0f), 0x7e);
    assert_int_equal(gptoss_e4m3_encode(463.9f), 0x7e);
    assert_int_equal(gptoss_e4m3_encode(464.0f), 0x7e); /* past 448: saturated, never 480 or NaN */
    assert_int_equal(gptoss_e4m3_encode(1e30f), 0x7e);
    assert_int_equal(gptoss_e4m3_encode(INFINITY), 0x7e);
    assert_int_equal(gptoss_e4m3_encode(-INFINITY), 0xfe);
    assert_int_equal(gptoss_e4m3_encode(-1e30f), 0xfe);
    assert_int_equal(gptoss_e4m3_encode(NAN), 0x7f);
    assert_int_equal(gptoss_e4m3_encode(-NAN), 0x7f);
    assert_int_equal(gptoss_e4m3_encode(0.0f), 0x00);
    assert_int_equal(gptoss_e4m3_encode(-0.0f), 0x80);
    assert_int_equal(gptoss_e4m3_encode(bits_float(1)), 0x00); /* smallest fp32 subnormal */
    assert_int_equal(gptoss_e4m3_encode(0x1p-10f), 0x00);      /* half of 2^-9: tie to 0 */
    assert_int_equal(gptoss_e4m3_encode(nextafterf(0x1p-10f, 1.0f)), 0x01);
}

/* Every bf16 bit pattern (every float with a zero low half: the whole exponent range, both
 * signs, infinities, NaNs), and a million random float bit patterns and random values in
 * e4m3's range. */
static void test_encode_brute_force(void **state) {
    (void)state;
    encode_mismatches = 0;
    for (uint32_t h = 0; h < 65536; h++)
        check_encode(bits_float(h << 16));
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = next_u32();
        float x =
            (i & 1) ? bits_float(u) : ldexpf((float)(u >> 8) / 16777216.0f, (int)(u % 24) - 14);
        if (i % 3 == 0) x = -x;
        check_encode(x);
    }
    assert_int_equal(encode_mismatches, 0);
}

/* The vector round trip: the scale is absmax / 448, the largest element lands on +-448, and
 * every element comes back within half a step of its binade: 2^-4 of itself where x / scale
 * is in e4m3's normal range (>= 2^-6), 2^-10 * scale (half a subnormal step) below that. */
static void test_round_trip_bounds(void **state) {
    (void)state;
    for (int trial = 0; trial < 2000; trial++) {
        int n = 1 + (int)(next_u32() % 128);
        float x[128], y[128];
        uint8_t codes[128];
        float magnitude = ldexpf(1.0f, (int)(next_u32() % 60) - 30);
        for (int i = 0; i < n; i++) {
            float u = (float)(next_u32() >> 8) / 16777216.0f * 2.0f - 1.0f;
            /* some vectors with a wide spread: small elements reach the subnormal codes */
            x[i] = u * magnitude * ((trial & 1) ? ldexpf(1.0f, -(int)(next_u32() % 16)) : 1.0f);
        }
        memcpy(y, x, sizeof x);
        float absmax = 0;
        for (int i = 0; i < n; i++)
            absmax = fmaxf(absmax, fabsf(x[i]));
        float scale = gptoss_kv_fp8_round_trip(y, n, codes);
        assert_true(scale == absmax / 448.0f);
        for (int i = 0; i < n; i++) {
            assert_int_equal(codes[i], gptoss_kv_fp8_quantize(x[i], scale));
            assert_true(y[i] == gptoss_e4m3_decode(codes[i]) * scale);
            double err = fabs((double)y[i] - x[i]), r = fabs((double)x[i] / scale);
            double bound = r >= 0x1p-6 ? 0x1p-4 * fabs((double)x[i]) : 0x1p-10 * (double)scale;
            if (err > bound * (1 + 1e-5))
                fail_msg("trial %d element %d: %a -> %a, error %.3g over %.3g", trial, i,
                         (double)x[i], (double)y[i], err, bound);
            if (fabsf(x[i]) == absmax && absmax > 0) assert_int_equal(codes[i] & 0x7f, 0x7e);
        }
    }
}

/* A zero vector: scale 0, codes 0, zeros back (no 0/0). A NaN element stays NaN and does not
 * poison the others' scale; an infinite one is not silently clipped (it reads back NaN). */
static void test_round_trip_edges(void **state) {
    (void)state;
    float zeros[8] = {0, -0.0f, 0, 0, 0, 0, 0, 0};
    uint8_t codes[8];
    assert_true(gptoss_kv_fp8_round_trip(zeros, 8, codes) == 0.0f);
    for (int i = 0; i < 8; i++) {
        assert_true(zeros[i] == 0.0f && !isnan(zeros[i]));
        assert_int_equal(codes[i] & 0x7f, 0);
    }
    /* absmax 3.5 = 448 * 2^-7: a power-of-two scale, so these values come back exactly */
    float with_nan[4] = {1.0f, NAN, -3.5f, 0.5f};
    float scale = gptoss_kv_fp8_round_trip(with_nan, 4, codes);
    assert_true(scale == 0x1p-7f);
    assert_true(isnan(with_nan[1]));
    assert_true(with_nan[0] == 1.0f && with_nan[2] == -3.5f && with_nan[3] == 0.5f);
    float with_inf[3] = {1.0f, INFINITY, -3.0f};
    gptoss_kv_fp8_round_trip(with_inf, 3, codes);
    assert_true(isnan(with_inf[1]));
}

int main(void) {
    build_table();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_all_codes),
        cmocka_unit_test(test_encode_values_and_midpoints),
        cmocka_unit_test(test_encode_edges),
        cmocka_unit_test(test_encode_brute_force),
        cmocka_unit_test(test_round_trip_bounds),
        cmocka_unit_test(test_round_trip_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
