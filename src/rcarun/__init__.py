"""rcarun: root-cause attribution of failed agent runs across many LLM backbones."""
