"""A torchrun whose argument parser lacks `--log-line-prefix-template`, as torch 2.11's does
(that option came later; 2.11 reads the prefix from env TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
only). The launcher's tests run lesson 07's launches through it:

    COURSE_TORCHRUN_MODULE=torchrun_without_prefix  (with this folder on PYTHONPATH)

Everything else is the installed torchrun.
"""
import sys

import torch.distributed.run as run

REMOVED = ("--log-line-prefix-template", "--log_line_prefix_template")
_installed_parser = run.get_args_parser


def get_args_parser():
    parser = _installed_parser()
    for action in list(parser._actions):
        if set(action.option_strings) & set(REMOVED):
            parser._remove_action(action)
            for group in parser._action_groups:
                if action in group._group_actions:
                    group._group_actions.remove(action)
            for option in action.option_strings:
                parser._option_string_actions.pop(option, None)
    # what torch 2.11's config_from_args amounts to: the template from the environment only
    parser.set_defaults(log_line_prefix_template="")
    return parser


run.get_args_parser = get_args_parser

if __name__ == "__main__":
    sys.exit(run.main())
