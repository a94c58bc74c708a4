"""Train a Llama: python pytorch/llama/run.py --mode train"""
from common.folder import import_beside
from common.pytorch.run import run

model, data, utils = import_beside(__file__, "model", "data", "utils")


def main(argv=None):
    return run(model.model_fn, data.get_train_dataloader, data.get_eval_dataloader, utils.default_params, argv=argv)


if __name__ == "__main__":
    main()
