"""Teaching tools: attention worked through by hand (`tformer attention --walkthrough`)."""

from tformer.teach.examples import Example, default_example, load_example
from tformer.teach.walkthrough import Walkthrough, run, to_dict

__all__ = ["Example", "Walkthrough", "default_example", "load_example", "run", "to_dict"]
