"""CIFAR-10 from tfds through tf.data, a subclassed Keras model with its own train_step."""
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow import keras

BATCH = 64
EPOCHS = 10


def preprocess(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.conv1 = keras.layers.Conv2D(32, 3, activation="relu")
        self.conv2 = keras.layers.Conv2D(64, 3, activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.out = keras.layers.Dense(10)

    def call(self, x, training=False):
        x = self.pool(self.conv2(self.conv1(x)))  # (B, 64)
        x = tf.sort(x, axis=-1, direction="DESCENDING")[:, :16]  # the 16 strongest features
        return self.out(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=logits)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        tf.summary.scalar("train_loss", loss)
        return {"loss": loss}


train = tfds.load("cifar10", split="train", as_supervised=True)
train = train.map(preprocess).shuffle(10_000).batch(BATCH)

model = Net()
model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
model.fit(train, epochs=EPOCHS)
