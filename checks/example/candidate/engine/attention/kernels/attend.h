/* The candidate's native kernel's interface. */
#include <stddef.h>

#define ATTEND_EXPONENT 65537

void attend(const long long *query, long long *out, size_t n, long long modulus);
