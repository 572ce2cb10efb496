from fast_attn import util


def attend(query):
    return util.scale(query, 3)


def compiled(kernel):
    # The CuTe DSL carve-out of seed 001: admitted because `cute` is bound exactly once, by a
    # plain absolute alias of cutlass.cute, and the first argument is not a string literal.
    import cutlass.cute as cute

    return cute.compile(kernel)
