def scale(query, k):
    return [q * k for q in query]
