"""The candidate's sealed-direct-artifact factory (the AOT tier's closed compile ABI).

The validator's compile driver imports this module in the prebuild's bounded child and calls
build(request) with the host's compile request (schema cordon.compile-request/1). It returns
the artifact's bytes and its profile (schema cordon.compile-profile/1); the host checks the
profile against the request and the artifact before sealing, and never loads the artifact.
"""
EXPONENT = 65537


def build(request):
    # The toy's "compiled" kernel: a table of the request's target and the exponent the
    # kernel raises each token to.
    target = request["target"]
    artifact = ("attend %s %s exponent=%d\n" % (target["arch"], target["device"], EXPONENT)).encode()
    profile = {
        "schema": "cordon.compile-profile/1",
        "factory": request["factory"],
        "entry": "attend",
        "artifact": {"bytes": len(artifact)},
        "inputs": request["inputs"],
    }
    return artifact, profile
