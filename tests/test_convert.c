/*
 * test_convert.c: host conversions between f32 and bf16 / f16: every 16-bit pattern round-trips,
 * ties round to even, NaN stays NaN, infinities and subnormals are kept; f16 is compared with the
 * compiler's own _Float16 conversion where it has one.
 */
#include <math.h>
#include <string.h>

#include "harness.h"

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void test_bf16_round_trip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = llmcl_bf16_to_f32((uint16_t)h);
        assert_int_equal(bits(f), h << 16);
        if (isnan(f))
            assert_true(isnan(llmcl_bf16_to_f32(llmcl_f32_to_bf16(f))));
        else
            assert_int_equal(llmcl_f32_to_bf16(f), h);
    }
}

static void test_bf16_rounding(void **state)
{
    (void)state;
    assert_int_equal(llmcl_f32_to_bf16(from_bits(0x3f808000u)), 0x3f80); /* tie to even: down */
    assert_int_equal(llmcl_f32_to_bf16(from_bits(0x3f818000u)), 0x3f82); /* tie to even: up */
    assert_int_equal(llmcl_f32_to_bf16(from_bits(0x3f808001u)), 0x3f81); /* above the tie */
    assert_int_equal(llmcl_f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80); /* below the tie */
    assert_int_equal(llmcl_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(llmcl_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(llmcl_f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    assert_int_equal(llmcl_f32_to_bf16(from_bits(0x00008000u)), 0x0000); /* subnormal tie: even */
    assert_int_equal(llmcl_f32_to_bf16(from_bits(0x00018000u)), 0x0002);
    assert_int_equal(llmcl_f32_to_bf16(from_bits(0x00010000u)), 0x0001); /* smallest subnormal */
    assert_int_equal(llmcl_f32_to_bf16(-0.0f), 0x8000);
    /* a NaN whose payload lives only in the low bits must not become infinity */
    const uint16_t n = llmcl_f32_to_bf16(from_bits(0x7f800001u));
    assert_true(isnan(llmcl_bf16_to_f32(n)));
    assert_true(isnan(llmcl_bf16_to_f32(llmcl_f32_to_bf16(from_bits(0xffc00000u)))));
}

static void test_f16_round_trip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = llmcl_f16_to_f32((uint16_t)h);
        if (isnan(f))
            assert_true(isnan(llmcl_f16_to_f32(llmcl_f32_to_f16(f))));
        else
            assert_int_equal(llmcl_f32_to_f16(f), h);
    }
    assert_true(llmcl_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(llmcl_f16_to_f32(0x7bff) == 65504.0f);
    assert_int_equal(llmcl_f32_to_f16(65520.0f), 0x7c00);      /* overflow tie rounds to inf */
    assert_int_equal(llmcl_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(llmcl_f32_to_f16(0x1p-25f), 0x0000);      /* tie to even: zero */
    assert_int_equal(llmcl_f32_to_f16(0x1.8p-24f), 0x0002);    /* tie to even: up */
    assert_int_equal(llmcl_f32_to_f16(0x1.000002p-25f), 0x0001);
    assert_int_equal(llmcl_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even: down */
    assert_int_equal(llmcl_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
}

#ifdef __FLT16_MAX__
__extension__ typedef _Float16 compiler_f16; /* the compiler's own IEEE binary16 */
#endif

static void test_f16_matches_compiler(void **state)
{
    (void)state;
#ifdef __FLT16_MAX__
    th_rng r = th_rng_new(1234);
    for (int i = 0; i < 2000000; ++i) {
        /* random bit patterns cover every exponent, subnormals, infinities and NaNs */
        const float f = from_bits((uint32_t)(th_uniform(&r, 0, 4294967296.0)));
        const compiler_f16 c = (compiler_f16)f;
        uint16_t cb;
        memcpy(&cb, &c, 2);
        const uint16_t ours = llmcl_f32_to_f16(f);
        if (isnan(f))
            assert_true(isnan(llmcl_f16_to_f32(ours)));
        else if (ours != cb)
            fail_msg("f16 of %a: 0x%04x, compiler 0x%04x", (double)f, ours, cb);
    }
#else
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_round_trip),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_f16_round_trip),
        cmocka_unit_test(test_f16_matches_compiler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
