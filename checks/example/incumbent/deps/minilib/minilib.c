/* minilib: a reviewed third-party dependency the example incumbent vendors (the
 * dependency-patch tier's example). Modular multiplication for the attention kernel. */
long long minilib_mulmod(long long a, long long b, long long m)
{
    return a * b % m;
}
