"""The README's examples stay true: its plan example loads for the model it names."""

import os

from spmdcnn.graph import load_model
from spmdcnn.tiling.plan import parse_plan_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_plan_example_fits_its_model():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    start = text.index("```yaml\nformat: spmdcnn-plan/1") + len("```yaml\n")
    example = text[start:text.index("```", start)]
    plan = parse_plan_text(example, load_model(os.path.join(ROOT, "models", "cifar_cnn.yaml")), 64, 2, "README")
    assert plan["conv2.conv"].devices == (1, 0) and plan["fc1"].degrees == (1, 2)
    assert plan["conv1.relu"] == plan["conv1.bn"]          # relu inherits its input's configuration
