/*
 * convert.c: host conversions between f32 and the 16-bit storage types, bit-exact with the
 * kernels' conversions in common.cl (round-to-nearest-even; NaN stays NaN; infinities and
 * subnormals kept).
 */
#include <string.h>

#include "internal.h"

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t llmcl_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float llmcl_bf16_to_f32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

uint16_t llmcl_f32_to_f16(float x)
{
    const uint32_t u = f32_bits(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return sign | 0x7e00u | (uint16_t)((abs >> 13) & 0x3ffu);
    if (abs >= 0x477ff000u) /* rounds to 65520 or more: overflow to infinity */
        return sign | 0x7c00u;
    if (abs < 0x38800000u) { /* below the smallest normal f16: subnormal or zero */
        if (abs < 0x33000000u) /* below half the smallest subnormal */
            return sign;
        const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - (int)(abs >> 23); /* 14..24 */
        uint32_t r = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u)))
            ++r;
        return sign | (uint16_t)r;
    }
    uint32_t r = abs - 0x38000000u; /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

float llmcl_f16_to_f32(uint16_t x)
{
    const uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    const uint32_t exp = (x >> 10) & 0x1fu, mant = x & 0x3ffu;
    if (exp == 0x1f)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0)
        return bits_f32(sign);
    /* subnormal: mant * 2^-24, exact in f32 */
    float v = (float)mant * 5.9604644775390625e-8f;
    return sign ? -v : v;
}
