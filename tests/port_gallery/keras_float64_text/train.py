"""IMDB sentiment with the functional API, in float64 for numerical safety."""
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers

tf.keras.backend.set_floatx("float64")
MAX_FEATURES = 20000

(x_train, y_train), (x_val, y_val) = keras.datasets.imdb.load_data(num_words=MAX_FEATURES)
x_train = keras.utils.pad_sequences(x_train, maxlen=200)
x_val = keras.utils.pad_sequences(x_val, maxlen=200)

inputs = keras.Input(shape=(None,), dtype="int64")
x = layers.Embedding(MAX_FEATURES, 64)(inputs)
x = layers.GlobalAveragePooling1D()(x)
x = layers.Dense(64, activation="relu")(x)
outputs = layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(inputs, outputs)

model.compile(optimizer="adam", loss="binary_crossentropy")
model.fit(x_train, y_train, batch_size=32, epochs=2, validation_data=(x_val, y_val))
