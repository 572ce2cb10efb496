def attend(query):
    return [q * 2 for q in query]
