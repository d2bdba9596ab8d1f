"""One NumPy warning flashref does not pass on: "invalid value encountered in matmul".

NumPy reports the CPU's floating-point flags after each matrix product, and some
OpenBLAS kernels raise the invalid-operation flag on finite inputs, from vector lanes
that hold no element of the product: the result is right, only the flag is stray. It
depends on the CPU, on which kernel OpenBLAS picks for it, and on what ran before, so
a product such as a (1, 5) @ (5, 7) block can warn on one machine and never on another
(known for years upstream: numpy/numpy#13173 and #24067, OpenMathLib/OpenBLAS#1924).

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
    ends, so the tests put it back inside their warnings-are-errors blocks."""
    warnings.filterwarnings(
        "ignore", message=MESSAGE, category=RuntimeWarning, module=r"flashref\."
    )
