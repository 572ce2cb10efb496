/* The candidate's native kernel (the native-sources tier): the same tokens as the Python kernel,
 * by square-and-multiply modulo a prime. Compiled by the validator's registered patcher with its
 * own flags (freestanding: no libc), never by a build script of the candidate's. */
#include <stddef.h>
#include "attend.h"

static long long power(long long base, long long exponent, long long modulus)
{
    long long result = 1;
    base %= modulus;
    while (exponent > 0) {
        if (exponent & 1)
            result = result * base % modulus;
        base = base * base % modulus;
        exponent >>= 1;
    }
    return result;
}

void attend(const long long *query, long long *out, size_t n, long long modulus)
{
    for (size_t i = 0; i < n; i++)
        out[i] = power(query[i], ATTEND_EXPONENT, modulus);
}
