def power(query, exponent, modulus):
    return [pow(q, exponent, modulus) for q in query]
