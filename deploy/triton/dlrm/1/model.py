"""nearrec on Triton (as nearrec.triton.export writes it): numpy < 2 first on the Python
backend stub's path (it reads numpy 1's arrays only), then the environment nearrec is installed
in; the model itself is nearrec.triton.TritonPythonModel."""
import sys

sys.path[:0] = ['/opt/numpy1', '/usr/local/lib/python3.11/site-packages']

from nearrec.triton import TritonPythonModel  # noqa: E402,F401
