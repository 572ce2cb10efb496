EXPONENT = 65537


def attend(query, modulus=1000003):
    # The incumbent's reference kernel: modular exponentiation by repeated multiplication.
    out = []
    for q in query:
        acc = 1
        for _ in range(EXPONENT):
            acc = acc * q % modulus
        out.append(acc)
    return out
