"""One NumPy warning flashref does not pass on: "invalid value encountered in matmul".

NumPy reports the CPU's floating-point flags after each matrix product, and OpenBLAS
kernels have raised the invalid-operation flag on finite inputs whose product is right
(numpy/numpy#13173 and #24067, OpenMathLib/OpenBLAS#1924). Which kernel runs depends on
the CPU, so it shows on some machines only: on one, the (1, 5) @ (5, 7) products of the
backward's tests warned, in flashref's tiled backward and in the tests' own textbook
backward alike, and the test that takes the latter's gradients as its bound passed,
which it cannot with a NaN in them.

Inside flashref that warning says nothing about the result. A product of finite
numbers can only come out NaN by first overflowing to infinity, and "overflow
encountered in matmul" is still reported; a NaN or infinite input gives NaN in the
output, as in any attention library, and that NaN is in the result for the caller to
see. So the filter below drops exactly that message, only where the product is
computed in a flashref module; a matrix product in the caller's own code still warns.
"""

import warnings

MESSAGE = "invalid value encountered in matmul"


def ignore_stray_matmul_flag() -> None:
    """Put the filter in front of the current warning filters. flashref does so on import;
    an import inside ``warnings.catch_warnings()`` (as under pytest) loses it when the block
    ends."""
    warnings.filterwarnings(
        "ignore", message=MESSAGE, category=RuntimeWarning, module=r"flashref\."
    )
