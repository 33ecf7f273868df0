from recurrl.envs.multiagent_recall import MultiAgentRecallEnv as Defined
from recurrl.testing import MultiAgentRecallEnv
from recurrl.testing.multiagent_envs import MultiAgentRecallEnv as Module


def test_the_testing_name_is_the_env_layers_class():
    assert MultiAgentRecallEnv is Defined is Module
