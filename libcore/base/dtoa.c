#include "dtoa.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An unsigned 128-bit integer as two halves (plain C11 has no wider type). */
typedef struct {
    uint64_t hi, lo;
} u128;

/* Full 64x64 -> 128-bit product from 32-bit pieces. */
static u128 mul64(uint64_t a, uint64_t b)
{
    uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    u128 r = {p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32), (mid << 32) | (p00 & 0xffffffffu)};
    return r;
}

/* x >> s for 0 < s < 128. */
static u128 shr(u128 x, int s)
{
    u128 r;
    if (s >= 64) {
        r.hi = 0;
        r.lo = x.hi >> (s - 64);
    } else {
        r.hi = x.hi >> s;
        r.lo = (x.lo >> s) | (x.hi << (64 - s));
    }
    return r;
}

/* x << s for 0 < s < 128 (callers keep the result below 2^128). */
static u128 shl(u128 x, int s)
{
    u128 r;
    if (s >= 64) {
        r.hi = x.lo << (s - 64);
        r.lo = 0;
    } else {
        r.hi = (x.hi << s) | (x.lo >> (64 - s));
        r.lo = x.lo << s;
    }
    return r;
}

/* a - b for a >= b. */
static u128 sub(u128 a, u128 b)
{
    u128 r = {a.hi - b.hi - (a.lo < b.lo), a.lo - b.lo};
    return r;
}

/* a >= b. */
static int ge(u128 a, u128 b)
{
    return a.hi != b.hi ? a.hi > b.hi : a.lo >= b.lo;
}

/* a + small. */
static u128 add_small(u128 a, uint64_t b)
{
    u128 r = {a.hi + (a.lo + b < a.lo), a.lo + b};
    return r;
}

/* "[-]whole.frac" with frac zero-padded to d digits, without printf. */
static int write_fixed(char *out, int neg, uint64_t whole, uint64_t frac, int d)
{
    char tmp[48];
    int i = (int)sizeof tmp;
    for (int k = 0; k < d; k++) {
        tmp[--i] = (char)('0' + frac % 10);
        frac /= 10;
    }
    tmp[--i] = '.';
    do {
        tmp[--i] = (char)('0' + whole % 10);
        whole /= 10;
    } while (whole);
    if (neg) tmp[--i] = '-';
    int n = (int)sizeof tmp - i;
    memcpy(out, tmp + i, (size_t)n);
    out[n] = 0;
    return n;
}

/* Reference form: the shortest of %.15g/%.16g/%.17g that reads back as v
 * (correctly rounded at each length, so also the shortest overall). */
int sd_dtoa_shortest_printf(double v, char *out, size_t cap)
{
    int n = 0;
    for (int prec = 15; prec <= 17; prec++) {
        n = snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    return n;
}

/* Write the shortest decimal that reads back as v (non-integral, finite), in
 * fixed notation when 0.01 <= |v| < 2^31 (exact integer arithmetic: for D
 * fractional digits, the nearest N = round(v * 10^D) is accepted once
 * N / 10^D lies in v's rounding interval), else through printf. Returns the
 * length written. */
int sd_dtoa_shortest(double v, char *out, size_t cap)
{
    static const uint64_t pow10[20] = {1ull,
                                       10ull,
                                       100ull,
                                       1000ull,
                                       10000ull,
                                       100000ull,
                                       1000000ull,
                                       10000000ull,
                                       100000000ull,
                                       1000000000ull,
                                       10000000000ull,
                                       100000000000ull,
                                       1000000000000ull,
                                       10000000000000ull,
                                       100000000000000ull,
                                       1000000000000000ull,
                                       10000000000000000ull,
                                       100000000000000000ull,
                                       1000000000000000000ull,
                                       10000000000000000000ull};
    double a = fabs(v);
    if (!(a >= 0.01 && a < 2147483648.0) || a == floor(a) || cap < 48) return sd_dtoa_shortest_printf(v, out, cap);
    int e2;
    double fr = frexp(a, &e2);                  /* a = fr * 2^e2, fr in [0.5, 1) */
    uint64_t m = (uint64_t)ldexp(fr, 53);        /* exact 53-bit mantissa */
    int s = 53 - e2;                             /* a = m / 2^s, 22 <= s <= 60 */
    uint64_t ip = (uint64_t)floor(a);
    for (int d = 1; d <= 19; d++) {
        u128 p = mul64(m, pow10[d]);             /* v * 10^d * 2^s, exactly */
        u128 n = shr(p, s);
        u128 rem = sub(p, shl(n, s));
        u128 half = shl((u128){0, 1}, s - 1);
        if (ge(rem, half) && !(rem.hi == half.hi && rem.lo == half.lo && !(n.lo & 1))) n = add_small(n, 1);
        u128 np = shl(n, s);
        u128 diff = ge(np, p) ? sub(np, p) : sub(p, np);
        /* inside the rounding interval: 2*diff < 10^d, or == with an even mantissa */
        if (diff.hi || diff.lo > (pow10[d] >> 1) + 1) continue;
        u128 twice = shl(diff, 1);
        int inside = twice.hi == 0 && (twice.lo < pow10[d] || (twice.lo == pow10[d] && !(m & 1)));
        if (!inside) continue;
        u128 ipd = mul64(ip, pow10[d]);
        uint64_t frac = ge(n, ipd) ? sub(n, ipd).lo : 0;
        uint64_t whole = ip;
        if (frac >= pow10[d]) {
            whole++;
            frac -= pow10[d];
        }
        while (d > 1 && frac % 10 == 0) {
            frac /= 10;
            d--;
        }
        return write_fixed(out, v < 0, whole, frac, d);
    }
    return sd_dtoa_shortest_printf(v, out, cap);
}

/* A float written through a double prints all the binary digits the
 * widening keeps (1e-5f as 9.999999747378752e-06); configs written for
 * Python readers want the digits the value was given with. The shortest
 * of 1..9 significant digits that reads back as v as a float (9 always
 * does), returned as the double those digits name, which sd_dtoa_shortest
 * then prints with the same digits. */
double sd_f32_shortest(float v)
{
    if (!isfinite(v) || v == 0) return v;
    char tmp[48];
    for (int prec = 1; prec < 9; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, (double)v);
        double d = strtod(tmp, NULL);
        if ((float)d == v) return d;
    }
    return v;
}
