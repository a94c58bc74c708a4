"""Train Llama: python tf/llama/run.py --mode train"""
from common.folder import import_beside
from common.tf.run import run

model, data, utils = import_beside(__file__, "model", "data", "utils")


def main(argv=None):
    return run(model.model_fn, data.train_input_fn, data.eval_input_fn, utils.default_params, argv=argv,
               predictions_done=model.predictions_done)


if __name__ == "__main__":
    main()
